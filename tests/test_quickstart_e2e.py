"""End to end on the real SmolLM2-135M-Instruct weights and real SNIPS data (``quickstart --fast``)."""

from __future__ import annotations

import json

import pytest

from tuneproof.cli import main
from tuneproof.io import read_jsonl
from tuneproof.registry import Registry

pytestmark = pytest.mark.slow


def test_quickstart_fast_runs_the_whole_protocol(tmp_path, shared_data, capsys):
    study = tmp_path / "qs"
    with pytest.raises(SystemExit) as exit_:
        main(["quickstart", "--fast", "--dir", str(study), "--data", str(shared_data)])
    assert exit_.value.code == 0
    said = capsys.readouterr().out
    reg = Registry(study)
    runs = {r.kind: r for r in reg.list() if not r.summary.get("control")}
    # the few-shot control: 3 shots of 3 intents from the train split, compared with LoRA, said in one line
    (few,) = [r for r in reg.list() if r.summary.get("control") == "few_shot"]
    shots = json.loads((study / "runs" / few.id / "shots.json").read_text())
    assert shots["k"] == 3 and shots["split"] == "train" and len(shots["classes"]) == 3
    evaluated = {r["id"] for r in read_jsonl(study / "runs" / few.id / "outputs.jsonl")}
    assert len(evaluated) == 7 and not evaluated & {s["id"] for s in shots["shots"]}
    cmp = json.loads((study / "runs" / runs["compare"].id / "compare.json").read_text())
    assert few.id in cmp["candidates"][runs["eval"].id]["controls"]
    line = next(x for x in said.splitlines() if f"3-shot prompt {few.id}" in x and "paired delta" in x)
    assert line.startswith(("LoRA beat", "LoRA did not beat", "LoRA is not shown to beat"))
    assert all(r.status == "completed" for r in reg.list()), [(r.id, r.status, r.reason) for r in reg.list()]
    assert {"baseline", "train", "eval", "compare", "export"} <= set(runs)
    # the baseline and the eval saw the same 7 examples (one per intent) and kept every output
    base_out = read_jsonl(study / "runs" / runs["baseline"].id / "outputs.jsonl")
    eval_out = read_jsonl(study / "runs" / runs["eval"].id / "outputs.jsonl")
    assert [r["id"] for r in base_out] == [r["id"] for r in eval_out] and len(base_out) == 7
    assert len({r["category"] for r in base_out}) == 7
    assert runs["baseline"].eval_fingerprint == runs["eval"].eval_fingerprint
    # training logged 3 finite losses and saved a PEFT adapter
    metrics = read_jsonl(study / "runs" / runs["train"].id / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3] and all(0 < m["loss"] < 20 for m in metrics)
    assert (study / "runs" / runs["train"].id / "adapter" / "adapter_config.json").exists()
    # the export names the exact base: the GGUF file's sha256 is the revision
    manifest = json.loads((study / "exports" / runs["train"].id / "manifest.json").read_text())
    base = manifest["base_model"]
    assert (
        base["revision"] == base["source_weight_sha256"]["SmolLM2-135M-Instruct.Q4_1.gguf"]
        and len(base["revision"]) == 64
    )
    assert set(base["weight_files"]) == {"model.safetensors"} and len(base["weight_files"]["model.safetensors"]) == 64
    # the data version records the CESU-8 repair of SNIPS PlayMusic (docs/CASES.md C17)
    data = json.loads((study / "runs" / runs["baseline"].id / "data.json").read_text())
    assert any("PlayMusic" in r and "U+1F355" in r for r in data["repairs"])
    assert (study / "dossier.md").read_text().count(runs["train"].id) >= 1
