"""Bad input through the CLI: one clear message, exit code 2, nothing left marked completed."""

from __future__ import annotations

import pytest
import yaml

from tuneproof.cli import main
from tuneproof.recipes.init import template_text
from tuneproof.registry import Registry


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(args)
    out = capsys.readouterr()
    return exit_.value.code, out.out + out.err


def test_init_then_unknown_key_and_unknown_task(tmp_path, capsys):
    code, _ = run_cli(["init", str(tmp_path / "s"), "--task", "classification"], capsys)
    assert code == 0 and (tmp_path / "s" / "tuneproof.yaml").exists()
    code, out = run_cli(["init", str(tmp_path / "t"), "--task", "summarise"], capsys)
    assert code == 2 and "unknown task kind 'summarise'" in out
    raw = yaml.safe_load(template_text("extraction"))
    raw["method"]["rank"] = 8
    (tmp_path / "u").mkdir()
    (tmp_path / "u" / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    code, out = run_cli(["baseline", "--study", str(tmp_path / "u")], capsys)
    assert code == 2 and "unknown key 'method.rank'" in out and "tuneproof.yaml" in out
    assert "Traceback" not in out


def test_init_given_the_study_file_or_an_unwritable_place_says_so_in_one_line(tmp_path, capsys):
    run_cli(["init", str(tmp_path / "s")], capsys)
    code, out = run_cli(["init", str(tmp_path / "s" / "tuneproof.yaml")], capsys)
    assert code == 2 and "tuneproof.yaml is a file, not a folder" in out
    assert f"name the folder: tuneproof init {tmp_path / 's'}" in " ".join(out.split())
    code, out = run_cli(["init", "/proc/no-such-tuneproof/study"], capsys)
    assert code == 2 and "cannot write the study into /proc/no-such-tuneproof/study (No such file or directory)" in out
    assert "Traceback" not in out


def test_study_option_given_the_study_file_reads_its_folder_and_another_file_is_one_line(tmp_path, capsys):
    run_cli(["init", str(tmp_path / "s")], capsys)
    code, out = run_cli(["runs", "--study", str(tmp_path / "s" / "tuneproof.yaml"), "--json"], capsys)
    assert code == 0 and out.strip() == "[]"  # the folder's (empty) registry, no FileExistsError
    code, out = run_cli(["runs", "--study", str(tmp_path / "s" / "tuneproof.schema.json")], capsys)
    assert code == 2 and "a file, not a study folder" in out and "Traceback" not in out


def test_missing_data_file_fails_without_a_completed_run(tmp_path, capsys):
    raw = yaml.safe_load(template_text("format"))  # reads data.jsonl from the study folder
    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    code, out = run_cli(["baseline", "--study", str(tmp_path)], capsys)
    assert code == 2 and "data.jsonl: file not found" in out
    assert all(r.status != "completed" for r in Registry(tmp_path).list())


def test_unknown_run_id(tmp_path, capsys):
    (tmp_path / "tuneproof.yaml").write_text(template_text("extraction"))
    code, out = run_cli(["show", "r0042", "--study", str(tmp_path)], capsys)
    assert code == 2 and "run 'r0042' does not exist" in out


def test_wrong_column_is_named(tmp_path, capsys):
    raw = yaml.safe_load(template_text("format"))
    raw["data"]["sources"] = [{"path": "d.csv", "format": "csv"}]
    raw["data"]["fields"] = {"text": "utterance", "target": "target"}
    (tmp_path / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "d.csv").write_text('text,target\nhello,"{""intent"": ""a""}"\n')
    code, out = run_cli(["data", "check", "--study", str(tmp_path)], capsys)
    assert code == 2 and "d.csv:1: column 'utterance' not found (columns: text, target)" in out


def test_usage_errors_exit_2_without_traceback(tmp_path, capsys):
    code, out = run_cli(["invalidate", "r0001", "--study", str(tmp_path)], capsys)
    assert code == 2 and "Missing option" in out and "--why" in out and "Traceback" not in out
    code, out = run_cli(["runs", "--bogus"], capsys)
    assert code == 2 and "No such option" in out and "Traceback" not in out
