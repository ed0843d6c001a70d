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
