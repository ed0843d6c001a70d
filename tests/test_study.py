"""The study file: validation, key paths in errors, unknown keys refused."""

from __future__ import annotations

import pytest
import yaml

from tuneproof.context import load_study
from tuneproof.errors import TuneproofError
from tuneproof.recipes.init import template_text
from tuneproof.study import resolved_config, set_key


def write(tmp_path, raw) -> object:
    p = tmp_path / "tuneproof.yaml"
    p.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return p


@pytest.mark.parametrize("task", ["extraction", "classification", "format"])
def test_every_template_is_valid(tmp_path, task):
    study = load_study(write(tmp_path, template_text(task)))
    assert study.hypothesis.task == task


def test_unknown_key_names_the_key_path_and_file(tmp_path):
    raw = yaml.safe_load(template_text("extraction"))
    raw["training"]["learning_rat"] = 0.1
    path = write(tmp_path, raw)
    with pytest.raises(TuneproofError) as err:
        load_study(path)
    assert "unknown key 'training.learning_rat' (did you mean 'training.learning_rate'?)" in str(err.value)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("section", "key", "said"),
    [
        ("training", "micro_batch_sise", " (did you mean 'training.micro_batch_size'?)"),
        ("method", "lora_r", " (did you mean 'method.r'?)"),  # Axolotl's name
        ("method", "rank", " (did you mean 'method.r'?)"),
        ("training", "num_train_epochs", " (did you mean 'training.epochs'?)"),  # TRL's name
        ("training", "zzz", ""),  # nothing close: no guess
    ],
)
def test_unknown_key_names_the_close_key_of_its_section(tmp_path, section, key, said):
    raw = yaml.safe_load(template_text("extraction"))
    raw[section][key] = 1
    with pytest.raises(TuneproofError) as err:
        load_study(write(tmp_path, raw))
    assert str(err.value).splitlines()[0].endswith(f"unknown key '{section}.{key}'{said}")


def test_unknown_key_inside_a_list_item_is_matched_against_the_item_keys(tmp_path):
    raw = yaml.safe_load(template_text("extraction"))
    raw["data"]["sources"][0]["pth"] = raw["data"]["sources"][0].pop("path")
    with pytest.raises(TuneproofError) as err:
        load_study(write(tmp_path, raw))
    assert "unknown key 'data.sources.0.pth' (did you mean 'data.sources.0.path'?)" in str(err.value)


def test_wrong_type_and_unknown_task(tmp_path):
    raw = yaml.safe_load(template_text("extraction"))
    raw["training"]["micro_batch_size"] = "eight"
    raw["hypothesis"]["task"] = "summarisation"
    with pytest.raises(TuneproofError) as err:
        load_study(write(tmp_path, raw))
    msg = str(err.value)
    assert "training.micro_batch_size" in msg and "hypothesis.task" in msg


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "name: x\nhypothesis: [unclosed\n")
    with pytest.raises(TuneproofError, match=r"tuneproof.yaml:\d+: YAML syntax error"):
        load_study(path)


def test_eval_split_cannot_be_the_reserved_test_split(tmp_path):
    raw = yaml.safe_load(template_text("extraction"))
    raw["eval"]["split"] = "test"
    with pytest.raises(TuneproofError, match="reserved test split"):
        load_study(write(tmp_path, raw))


def test_missing_file(tmp_path):
    with pytest.raises(TuneproofError, match="study file not found"):
        load_study(tmp_path / "nope")


def test_set_key_known_and_unknown(tmp_path):
    cfg = resolved_config(load_study(write(tmp_path, template_text("extraction"))))
    assert set_key(cfg, "method.r", "32")["method"]["r"] == 32
    assert cfg["method"]["r"] == 16  # the original is not mutated
    with pytest.raises(TuneproofError, match="unknown key 'method.rank'"):
        set_key(cfg, "method.rank", "32")


# --------------------------------------------------------------------------- each key's role (tuneproof.study.ROLES)
def _leaf_keys() -> list[str]:
    """Every key of the schema, nested sections walked (a list of sections by its item keys)."""
    from tuneproof.study import Study, _section_of

    out = []

    def walk(model, prefix):
        for name, field in model.model_fields.items():
            sub = _section_of(field.annotation)
            if sub is None:
                out.append(prefix + name)
            else:
                walk(sub, f"{prefix}{name}.")

    walk(Study, "")
    return out


def test_every_key_has_one_known_role():
    from tuneproof.study import ROLES, declared_roles, role_of

    keys = _leaf_keys()
    assert len(keys) > 80
    missing = [k for k in keys if role_of(k) is None]
    assert missing == [], f"keys without a role (add json_schema_extra=role(...) to their field): {missing}"
    assert set(declared_roles().values()) <= set(ROLES)
    # a role is declared once: never again under a section that already has one
    for key in declared_roles():
        parents = [".".join(key.split(".")[:i]) for i in range(1, key.count(".") + 1)]
        assert not [p for p in parents if p in declared_roles()], key


def test_roles_of_the_keys_that_drifted():
    """eval.grammar invalidated a preflight and eval.regex did not, although both only score outputs."""
    from tuneproof.hypothesis import FORMAT_KEYS
    from tuneproof.preflight.scope import is_exempt
    from tuneproof.study import role_of

    assert role_of("eval.grammar") == role_of("eval.regex") == "scores"
    assert is_exempt("eval.grammar") and is_exempt("eval.regex")
    assert set(FORMAT_KEYS) == {"allow_fenced_json", "json_schema", "regex", "grammar", "answer_from"}
    assert role_of("distributed.timeout_s") == "bookkeeping" and is_exempt("distributed.timeout_s")
    assert role_of("eval.max_new_tokens") == "decodes" and not is_exempt("eval.max_new_tokens")
    assert role_of("eval.prompt.template") == "trains" and role_of("tracking.mlflow.uri") == "tracking"
    assert role_of("training.no_such_key") is None and not is_exempt("training.no_such_key")


def test_every_key_is_read_by_some_code():
    """A key that no module reads is a silent no-op: each key's name is read outside the schema (an
    attribute ``.name``, a ``["name"]`` / ``.get("name"`` lookup, or a ``name=`` keyword built from the study)."""
    import re
    from pathlib import Path

    import tuneproof

    root = Path(tuneproof.__file__).parent
    text = "\n".join(p.read_text(encoding="utf-8") for p in root.rglob("*.py") if p.name != "study.py")

    def read(name: str) -> bool:
        return bool(re.search(rf"\.{name}\b|\[[\"']{name}[\"']\]|get\([\"']{name}[\"']|\b{name}=", text))

    assert not read("backend_check_sample_sizes")  # the scan can fail
    assert [k for k in _leaf_keys() if not read(k.split(".")[-1])] == []
