"""Bad input owned here (docs/CASES.md, faults of the input): prompt templates (literal braces; no {text}), split
fractions outside [0, 1] or not summing to 1, impossible `plan` options. Each: the key or option named in one
or two lines, exit 2, no run left completed, nothing written."""

from __future__ import annotations

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.registry import Registry
from tuneproof.study import render_prompt

pytestmark = pytest.mark.filterwarnings("ignore")

JSON_TEMPLATE = 'Reply as {"intent": ..., "slots": {}} for {text}'


def cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def _study(tmp_path, tiny_base, edit):
    from tiny_study import make_study

    study = make_study(tmp_path / "s", tiny_base, prepare=False)
    raw = yaml.safe_load((study / "tuneproof.yaml").read_text())
    edit(raw)
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return study


@pytest.mark.fault("input: prompt template")
def test_literal_braces_in_the_template_are_kept_and_only_text_is_substituted(tiny_base, tmp_path, capsys, one_thread):
    assert (
        render_prompt(JSON_TEMPLATE, "play jazz {loud}") == 'Reply as {"intent": ..., "slots": {}} for play jazz {loud}'
    )
    assert render_prompt("{{text}} {text}", "x") == "{x} x"  # not str.format: doubled braces are not escapes
    from tuneproof.context import StudyContext

    study = _study(tmp_path, tiny_base, lambda raw: raw["eval"]["prompt"].update(template=JSON_TEMPLATE))
    ctx = StudyContext.open(study)
    assert '<|user|> Reply as {"intent": ..., "slots": {}} for alpha' in ctx.pipeline.prompt_text("alpha")
    assert len(ctx.pipeline.encode_all(ctx.split("train"))) == 24
    code, out = cli(["baseline", "--study", str(study)], capsys)
    assert code == 0, out
    assert Registry(study).latest("baseline").status == "completed"


@pytest.mark.fault("input: prompt template")
def test_a_template_without_text_is_refused_naming_the_key(tiny_base, tmp_path, capsys):
    study = _study(tmp_path, tiny_base, lambda raw: raw["eval"]["prompt"].update(template="Extract the JSON"))
    code, out = cli(["baseline", "--study", str(study)], capsys)
    assert code == 2
    assert (
        f"{study / 'tuneproof.yaml'}: eval.prompt.template: has no {{text}}: every example would get the same prompt"
        in out
    )
    assert "Traceback" not in out and "Value error" not in out
    assert not (study / "runs").exists() or Registry(study).list() == []


@pytest.mark.fault("input: split fractions")
@pytest.mark.parametrize(
    "fractions,message",
    [
        ({"train": 1.5, "test": -0.5}, "data.split.fractions: train = 1.5 and test = -0.5 are outside [0, 1]"),
        ({"train": 0.8, "test": 1.2}, "data.split.fractions: test = 1.2 is outside [0, 1]"),
        (
            {"train": 0.8, "test": 0.1},
            "data.split.fractions: train 0.8 + test 0.1 = 0.9, not 1; make the fractions sum to 1",
        ),
    ],
)
def test_split_fractions_outside_0_1_or_not_summing_to_1_name_the_keys(tiny_base, tmp_path, capsys, fractions, message):
    def edit(raw):
        raw["data"]["split"] = {"fractions": fractions}

    study = _study(tmp_path, tiny_base, edit)
    code, out = cli(["data", "check", "--study", str(study)], capsys)
    assert code == 2 and f"{study / 'tuneproof.yaml'}: {message}" in out, out
    assert "split 'test' is empty" not in out and "Traceback" not in out
    assert not (study / "runs").exists() or Registry(study).list() == []


@pytest.mark.fault("input: split fractions")
def test_a_split_cap_below_1_names_the_key(tiny_base, tmp_path, capsys):
    study = _study(tmp_path, tiny_base, lambda raw: raw["data"].update(split={"max_examples": {"validation": 0}}))
    code, out = cli(["data", "check", "--study", str(study)], capsys)
    assert code == 2 and "data.split.max_examples: validation = 0: a cap must be at least 1" in out


@pytest.mark.fault("input: plan options")
@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--days", "-3", "--hourly-rate", "-1"],
            "--days -3: the rental length must be a number of days > 0; "
            "--hourly-rate -1: the price of one hour must be >= 0",
        ),
        (["--days", "0", "--hourly-rate", "2"], "--days 0: the rental length must be a number of days > 0"),
        (["--days", "nan", "--hourly-rate", "2"], "--days nan: the rental length must be a number of days > 0"),
        (["--days", "7", "--hourly-rate", "inf"], "--hourly-rate inf: the price of one hour must be >= 0"),
        (["--days", "7", "--hourly-rate", "2", "--variants", "0"], "--variants 0: plan for at least 1 variant"),
    ],
)
def test_plan_refuses_impossible_options_naming_them(tmp_path, capsys, args, message):
    from tuneproof.recipes.init import template_text

    (tmp_path / "tuneproof.yaml").write_text(template_text("extraction"))
    code, out = cli(["plan", *args, "--study", str(tmp_path)], capsys)
    assert code == 2 and f"error: {message}" in out, out
    assert "nothing measured" not in out and "Traceback" not in out
    assert not (tmp_path / "plan.json").exists()


def _base_with_template(tmp_path, tiny_base, template: str):
    import shutil

    base = tmp_path / "base"
    shutil.copytree(tiny_base, base)
    (base / "chat_template.jinja").write_text(template)
    return base


@pytest.mark.fault("input: chat template")
@pytest.mark.parametrize(
    "edit,message",
    [
        (  # nothing rendered when a generation prompt is asked for
            lambda t: "{% if not add_generation_prompt %}" + t.split("{% if add_generation_prompt")[0] + "{% endif %}",
            "the inference prompt is empty (the chat template renders nothing for the system and user messages with "
            "add_generation_prompt=True): the model would be asked nothing at inference, and the prompt tokens of "
            "the training text are supervised",
        ),
        (  # the assistant's content dropped
            lambda t: t.replace("{{ m['content'] }}", "{% if m['role'] != 'assistant' %}{{ m['content'] }}{% endif %}"),
            "the training text does not contain the answer (the chat template drops the assistant's content)",
        ),
    ],
)
def test_a_template_that_empties_the_prompt_or_drops_the_answer_fails_the_data_check_before_baseline(
    tiny_base, tmp_path, capsys, edit, message
):
    from tiny_study import CHAT_TEMPLATE

    base = _base_with_template(tmp_path, tiny_base, edit(CHAT_TEMPLATE))
    study = _study(tmp_path, base, lambda raw: None)
    code, out = cli(["baseline", "--study", str(study)], capsys)
    assert code == 3, out
    assert message in " ".join(out.split())
    assert "after truncation" not in out and "Traceback" not in out and "IndexError" not in out
    reg = Registry(study)
    assert [r.kind for r in reg.list()] == ["data-check"] and reg.list()[0].status == "failed"


@pytest.mark.fault("input: tokenizer with no end token")
def test_a_tokenizer_with_no_end_or_pad_token_is_one_line_before_baseline(tiny_base, tmp_path, capsys):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = _base_with_template(tmp_path, tiny_base, "")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (base / name).unlink(missing_ok=True)
    raw = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "alpha": 1, "beta": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]").save_pretrained(base)
    study = _study(tmp_path, base, lambda raw: None)
    code, out = cli(["baseline", "--study", str(study)], capsys)
    assert code == 2, out
    said = " ".join(out.split())
    assert f"tokenizer of {base}: TokenizersBackend has no pad token and no end token" in said
    assert "Traceback" not in out and "Asking to pad" not in out
    assert not (study / "runs").exists() or Registry(study).list() == []
