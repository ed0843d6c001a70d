"""``tuneproof baseline --few-shot K`` on the tiny study (issue 32 item 1): the control run records its shots (train
split only, the same draw every time), keeps the evaluation procedure but for its ``control`` part, is refused
before any run where few-shot is undefined or does not fit, and ``success.against: strongest`` freezes the control
chosen at the first train run, which compare then names."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tiny_study import make_study
from tuneproof.cli import main
from tuneproof.context import StudyContext
from tuneproof.errors import TuneproofError
from tuneproof.hypothesis import FROZEN_FILE
from tuneproof.io import read_json, read_jsonl
from tuneproof.recipes.few_shot import prepare_few_shot
from tuneproof.registry import Registry


def _cli(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    cap = capsys.readouterr()
    return e.value.code, cap.out + cap.err


def _ids(study, split: str) -> set[str]:
    return {json.loads(line)["id"] for line in (study / "data" / f"{split}.jsonl").read_text().splitlines()}


def test_a_few_shot_control_records_its_shots_and_keeps_the_procedure(tmp_path, tiny_base, capsys):
    study = make_study(tmp_path / "s", tiny_base)
    code, out = _cli(capsys, "baseline", "--study", str(study), "--few-shot", "2")
    assert code == 0, out
    assert "few-shot control (K=2) run" in out and "few-shot K=2: longest prompt" in out
    reg = Registry(study)
    plain, ctrl = reg.list(kind="baseline")
    shots = read_json(study / "runs" / ctrl.id / "shots.json")
    ids = [s["id"] for s in shots["shots"]]
    assert shots["k"] == 2 and shots["seed"] == 0 and shots["seed_from"] == "eval.seed" and len(ids) == 2
    assert set(ids) <= _ids(study, "train") and not set(ids) & (_ids(study, "validation") | _ids(study, "test"))
    fit = shots["fit"]
    assert fit["context_length"] == 128 and fit["needed_tokens"] == fit["longest_prompt_tokens"] + 8
    assert fit["longest_prompt_tokens"] > fit["plain_longest_prompt_tokens"]
    assert ctrl.summary["control"] == "few_shot" and ctrl.summary["few_shot"] == 2
    assert ctrl.summary["few_shot_ids"] == ids and ctrl.summary["few_shot_fit"]["fits"] is True
    fp_plain = read_json(study / "runs" / plain.id / "eval.json")["fingerprint"]["parts"]
    fp_ctrl = read_json(study / "runs" / ctrl.id / "eval.json")["fingerprint"]["parts"]
    assert set(fp_ctrl) - set(fp_plain) == {"control"} and all(fp_ctrl[k] == v for k, v in fp_plain.items())
    assert plain.eval_fingerprint != ctrl.eval_fingerprint
    out_plain = read_jsonl(study / "runs" / plain.id / "outputs.jsonl")
    out_ctrl = read_jsonl(study / "runs" / ctrl.id / "outputs.jsonl")
    assert [r["id"] for r in out_ctrl] == [r["id"] for r in out_plain]
    assert [r["input"] for r in out_ctrl] == [r["input"] for r in out_plain]
    # the same study draws the same shots
    ctx = StudyContext.open(study)
    again = prepare_few_shot(ctx, 2)
    assert [s.id for s in again.shots] == ids
    prompt = ctx.pipeline.prompt_text(again.examples[0])
    shown = {json.loads(x)["id"]: json.loads(x) for x in (study / "data" / "train.jsonl").read_text().splitlines()}
    first, second = (shown[i] for i in ids)
    at = [prompt.find("Extract JSON " + first["text"]), prompt.find("Extract JSON " + second["text"])]
    assert 0 <= at[0] < at[1] < prompt.find("Extract JSON " + again.examples[0].text)


@pytest.mark.parametrize(
    "k, phrase",
    [
        ("0", "K must be at least 1"),
        # 10 of the tiny study's 24 training inputs repeat a validation input: never shown as shots
        (
            "30",
            "the training split holds 24 examples, 10 of which repeat an evaluated example's input: 14 to draw "
            "from, fewer than K=30",
        ),
        ("12", "over the model's context length 128 (config.json max_position_embeddings)"),
    ],
)
def test_few_shot_is_refused_before_any_run_where_it_is_undefined(tmp_path, tiny_base, capsys, k, phrase):
    study = make_study(tmp_path / "s", tiny_base)
    before = len(Registry(study).list())
    code, out = _cli(capsys, "baseline", "--study", str(study), "--few-shot", k)
    assert code == 2 and phrase in " ".join(out.split()), out
    assert "Traceback" not in out and f"--few-shot {k}" in out
    assert len(Registry(study).list()) == before


def test_a_classification_head_has_no_prompt_to_show_shots_in():
    ctx = SimpleNamespace(study_dir=Path("/s"), head_labels=["a", "b"], model_kind="seq-cls")
    with pytest.raises(TuneproofError) as err:
        prepare_few_shot(ctx, 3)
    assert "reads no prompt" in err.value.message and "--few-shot 3" in err.value.message


def test_against_strongest_is_chosen_when_the_first_train_run_freezes_the_hypothesis(tmp_path, tiny_base, capsys):
    study = make_study(tmp_path / "s", tiny_base, max_steps=2)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["hypothesis"]["success"]["against"] = "strongest"
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _cli(capsys, "baseline", "--study", str(study), "--few-shot", "2")[0] == 0
    code, out = _cli(capsys, "train", "--study", str(study), "--skip-preflight", "a wiring test")
    assert code == 0, out  # the plain baseline still gates train: the control is not taken for it
    reg = Registry(study)
    plain, ctrl = reg.list(kind="baseline")
    train = reg.list(kind="train")[0]
    assert train.summary["baseline_run"] == plain.id
    frozen = read_json(study / FROZEN_FILE)
    against = frozen["against"]
    assert [c["run"] for c in against["considered"]] == [plain.id, ctrl.id]
    values = {c["run"]: c["value"] for c in against["considered"]}
    best = max(values.values())
    assert against["value"] == best and against["metric"] == "field_f1"
    # a tie keeps the plain baseline
    assert against["run"] == (plain.id if values[plain.id] == best else ctrl.id)
    assert _cli(capsys, "eval", train.id, "--study", str(study))[0] == 0
    code, out = _cli(capsys, "compare", reg.list(kind="eval")[0].id, "--study", str(study))
    assert code == 0, out
    cmp = read_json(study / "runs" / Registry(study).list(kind="compare")[0].id / "compare.json")
    assert cmp["judged_control"]["run"] == against["run"]
    (entry,) = cmp["candidates"].values()
    assert set(entry["controls"]) == {plain.id, ctrl.id}
    assert "success judged against" in out


def test_a_frozen_strongest_control_made_invalid_is_named_with_a_way_out(tmp_path, tiny_base, capsys):
    """The control ``success.against: strongest`` froze, invalidated later: compare said "r0002 is invalid after all
    6 examples, before its outputs were recorded; evaluate again" (its outputs were recorded; it was invalidated),
    and evaluating the base model again changed nothing (a later control is never judged against)."""
    study = make_study(tmp_path / "s", tiny_base, max_steps=2)
    cfg = yaml.safe_load((study / "tuneproof.yaml").read_text())
    cfg["hypothesis"]["success"]["against"] = "strongest"
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _cli(capsys, "train", "--study", str(study), "--skip-preflight", "a wiring test")[0] == 0
    reg = Registry(study)
    judged = read_json(study / FROZEN_FILE)["against"]["run"]
    assert _cli(capsys, "eval", reg.list(kind="train")[0].id, "--study", str(study))[0] == 0
    cand = reg.list(kind="eval")[0].id
    assert _cli(capsys, "invalidate", judged, "--why", "wrong weights", "--study", str(study))[0] == 0
    assert _cli(capsys, "baseline", "--study", str(study))[0] == 0
    code, out = _cli(capsys, "compare", cand, "--study", str(study))
    flat = " ".join(out.split())
    assert code == 3, out
    assert (
        f"hypothesis.frozen.json: success.against: strongest judges the success criterion against baseline "
        f"(the base model, the study's prompt) {judged}" in flat
    )
    assert f"cannot be read: {judged} is invalid (wrong weights" in flat
    assert "before its outputs were recorded" not in flat and "evaluate again" not in flat
    assert "--use-edited-hypothesis" in flat
    assert Registry(study).list(kind="compare") == []  # refused before any compare run
    code, out = _cli(capsys, "compare", cand, "--against", judged, "--study", str(study))
    assert code == 3 and f"{judged} is invalid (wrong weights" in " ".join(out.split()), out
    assert "before its outputs were recorded" not in out


def test_compare_against_a_few_shot_control_says_it_is_not_the_verdict(tmp_path, tiny_base, capsys):
    """``compare --against`` a few-shot control named it "hypothesis.success.against: baseline" and said nothing of
    the guards being judged against the control (the dossier rightly never takes it for the verdict)."""
    study = make_study(tmp_path / "s", tiny_base, max_steps=2)
    assert _cli(capsys, "baseline", "--study", str(study), "--few-shot", "2")[0] == 0
    assert _cli(capsys, "train", "--study", str(study), "--skip-preflight", "a wiring test")[0] == 0
    reg = Registry(study)
    plain, ctrl = reg.list(kind="baseline")
    assert _cli(capsys, "eval", reg.list(kind="train")[0].id, "--study", str(study))[0] == 0
    cand = reg.list(kind="eval")[0].id
    code, out = _cli(capsys, "compare", cand, "--against", ctrl.id, "--study", str(study))
    assert code in (0, 3), out
    cmp = read_json(study / "runs" / Registry(study).list(kind="compare")[0].id / "compare.json")
    assert cmp["baseline"] == ctrl.id and cmp["judged_control"]["run"] == ctrl.id
    assert cmp["judged_control"]["why"].startswith(f"--against {ctrl.id} (2-shot prompt): the control named, not the")
    assert (
        "hypothesis.success.against: baseline is judged by `tuneproof compare RUN` without --against"
        in (cmp["judged_control"]["why"])
    )
    (entry,) = cmp["candidates"].values()
    assert f"{ctrl.id} (2-shot prompt) is a control, not the plain baseline: the guards are judged against it" in (
        " ".join(entry["notes"])
    )
    assert set(entry["controls"]) == {plain.id, ctrl.id}
    comp = Registry(study).list(kind="compare")[0].id
    code, out = _cli(capsys, "compare", cand, "--against", comp, "--study", str(study))
    flat = " ".join(out.split())
    assert code == 2, (
        out
    )  # was "r0006 is incomplete: ... has no eval.json" and "`tuneproof eval r0002` evaluates again"
    assert f"run {comp} is a compare run; compare takes baseline/eval runs" in flat and "eval.json" not in flat
    assert len(Registry(study).list(kind="compare")) == 1


def test_an_interrupted_few_shot_control_is_run_again_with_its_k(tmp_path):
    from tuneproof.errors import CheckFailed
    from tuneproof.evaluation.outputs import check_complete

    rec = SimpleNamespace(id="r0009", kind="baseline", status="interrupted", reason="SIGTERM", summary={"few_shot": 3})
    with pytest.raises(CheckFailed) as err:
        check_complete(SimpleNamespace(runs_dir=tmp_path), rec)
    assert err.value.hint.startswith("`tuneproof baseline --few-shot 3` evaluates again")
    plain = SimpleNamespace(id="r0002", kind="baseline", status="failed", reason="", summary={})
    with pytest.raises(CheckFailed) as err:
        check_complete(SimpleNamespace(runs_dir=tmp_path), plain)
    assert err.value.hint.startswith("`tuneproof baseline` evaluates again")
