"""The study-file reference (docs/study-file.md) and the JSON Schema are generated from the study
schema's own field descriptions (src/tuneproof/study.py): this keeps them in step, and checks that
the schema an editor uses accepts every template and refuses what the loader refuses."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from tuneproof.recipes.init import run_init, template_text
from tuneproof.recipes.schema import groups, render_reference, schema_text
from tuneproof.study import SCHEMA_FILE, study_json_schema
from tuneproof.tasks import TASKS

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "study-file.md"


def test_reference_tables_match_the_schema():
    text = REFERENCE.read_text(encoding="utf-8")
    assert render_reference(text) == text, (
        "docs/study-file.md is out of step with src/tuneproof/study.py; run "
        "`python -m tuneproof schema --docs docs/study-file.md` and commit the result"
    )


def test_every_key_has_a_short_description():
    rows = [row for table in groups().values() for row in table]
    assert len(rows) > 80  # every key of every section, nested ones included
    keys = {row[0] for row in rows}
    assert {"hypothesis.guards[].min_support", "data.sources[].format", "eval.prompt.template"} <= keys
    missing = [row[0] for row in rows if not row[3].strip()]
    assert missing == []
    long = [row[0] for row in rows if len(row[3]) > 400]
    assert long == []


def test_schema_accepts_each_template_and_refuses_unknown_keys():
    validator = jsonschema.Draft202012Validator(study_json_schema())
    for task in TASKS:
        text = template_text(task)
        assert text.splitlines()[0] == f"# yaml-language-server: $schema=./{SCHEMA_FILE}"
        raw = yaml.safe_load(text)
        assert list(validator.iter_errors(raw)) == [], task
    raw = yaml.safe_load(template_text("extraction"))
    raw["training"]["learning_rat"] = 1e-4
    raw["method"]["kind"] = "lorra"
    messages = sorted(e.message for e in validator.iter_errors(raw))
    assert any("'lorra' is not one of" in m for m in messages)
    assert any("'learning_rat' was unexpected" in m for m in messages)


def test_init_writes_the_schema_beside_the_study(tmp_path):
    path = run_init(tmp_path / "s", "classification")
    written = (path.parent / SCHEMA_FILE).read_text(encoding="utf-8")
    assert written == schema_text()
    assert json.loads(written)["$schema"] == "https://json-schema.org/draft/2020-12/schema"
