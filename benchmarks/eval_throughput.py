"""Benchmark: batched generation (left padding, KV cache, inference_mode) vs one example at a time.

Run by hand:  python benchmarks/eval_throughput.py [--n 32] [--batch 16] [--max-new-tokens 32]

Uses the real SmolLM2-135M-Instruct (alias smollm2-135m-instruct) on SNIPS validation prompts,
the study's own prompt building (`TextPipeline.prompt_text`) and `evaluation.generate.generate`,
so the measured path is the one `baseline`/`eval` use. Target (issue 5): batch 16 at least 4x
faster than batch 1 on a 2-core CPU. Prints examples/s for both, the ratio, and whether the
outputs are the same (greedy decoding; they can differ in the last digits of a logit between
padded and unpadded batches, which the script reports rather than hides).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tuneproof.data.locate import find_data_root  # noqa: E402
from tuneproof.data.preprocess import TextPipeline  # noqa: E402
from tuneproof.data.sources import load_snips  # noqa: E402
from tuneproof.data.split import stratified_take  # noqa: E402
from tuneproof.evaluation.generate import generate  # noqa: E402
from tuneproof.models.base import load_model, load_tokenizer, resolve_base  # noqa: E402
from tuneproof.study import Eval, ModelSpec, Prompt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32, help="examples")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    args = ap.parse_args()
    examples, _ = load_snips(find_data_root(None, "snips") / "snips")
    examples = stratified_take([e for e in examples if e.split == "validation"], args.n, 0)
    ref = resolve_base(ModelSpec(base="smollm2-135m-instruct"))
    tok = load_tokenizer(ref)
    model = load_model(ref, "causal-lm")
    pipe = TextPipeline(tok, Prompt(system="Reply with JSON only: the intent and the slots of the request."), 128)
    results = {}
    for bs in (1, args.batch):
        cfg = Eval(batch_size=bs, max_new_tokens=args.max_new_tokens)
        generate(model, tok, pipe, examples[:2], cfg, device=torch.device("cpu"), autocast=contextlib.nullcontext)  # warm-up
        t = time.perf_counter()
        outs = generate(model, tok, pipe, examples, cfg, device=torch.device("cpu"), autocast=contextlib.nullcontext)
        results[bs] = (time.perf_counter() - t, outs)
        print(f"batch {bs:3d}: {results[bs][0]:7.1f} s for {len(examples)} examples = {len(examples) / results[bs][0]:.2f} examples/s")
    (t1, o1), (tb, ob) = results[1], results[args.batch]
    same = sum(a == b for a, b in zip(o1, ob))
    print(f"speed-up batch {args.batch} vs 1: x{t1 / tb:.2f}; identical outputs {same}/{len(o1)}; "
          f"torch threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
