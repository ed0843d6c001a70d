"""End-to-end CUDA path of tuneproof on a small random Llama (no download): baseline, train with
precision auto (bf16 where native), eval, compare, export, report. Prints a JSON summary.

Run from the repository root on a GPU machine:  python scripts/gpu_smoke.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import yaml  # noqa: E402

from tinymodels import make_llama, make_tokenizer  # noqa: E402


def main(out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "tiny-llama"
    tok = make_tokenizer()
    make_llama(len(tok)).save_pretrained(model_dir, safe_serialization=True)
    tok.save_pretrained(model_dir)
    study = out / "study"
    study.mkdir()
    rows = [
        {
            "text": f"play song number {i} by artist {i % 7}",
            "target": json.dumps({"intent": "PlayMusic", "slots": {"n": str(i)}}),
        }
        for i in range(64)
    ]
    (study / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from tuneproof.recipes.init import template_text

    raw = yaml.safe_load(template_text("format"))
    raw["model"] = {"base": str(model_dir)}
    raw["training"].update(max_steps=20, micro_batch_size=8, learning_rate=3e-3, precision="auto")
    raw["eval"].update(max_new_tokens=24)
    (study / "tuneproof.yaml").write_text(yaml.safe_dump(raw))
    from tuneproof.cli import main as cli

    timings = {}
    # protocol order: data check r0001, baseline r0002, train r0003, eval r0004, compare r0005, export
    for args in (
        ["data", "check"],
        ["baseline"],
        ["train", "--skip-preflight", "gpu smoke"],
        ["eval", "r0003"],
        ["compare", "r0004"],
        ["export", "r0003"],
        ["report"],
    ):
        t = time.time()
        try:
            cli(args + ["--study", str(study)])
        except SystemExit as e:
            timings[args[0]] = {"exit": e.code, "s": round(time.time() - t, 2)}
    from tuneproof.registry import Registry

    reg = Registry(study)
    env = json.loads((study / "runs" / "r0003" / "env.json").read_text())
    return {
        "timings": timings,
        "runs": [(r.id, r.kind, r.status, r.reason) for r in reg.list()],
        "device_choice": env.get("device_choice"),
        "train_summary": reg.get("r0003").summary,
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpu_smoke")), indent=1, default=str))
