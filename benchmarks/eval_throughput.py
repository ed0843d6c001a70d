"""Benchmark: batched generation (left padding, KV cache, inference_mode) vs one example at a time.

Run by hand:  python benchmarks/eval_throughput.py [--n 32] [--batch 16] [--max-new-tokens 32] [--padding-only]

Uses the real SmolLM2-135M-Instruct (alias smollm2-135m-instruct) on SNIPS validation prompts,
the study's own prompt building (`TextPipeline.prompt_text`) and `modalities.text.generate`,
so the measured path is the one `baseline`/`eval` use. Target: batch 16 at least 4x
faster than batch 1 on a 2-core CPU. Prints examples/s for both, the ratio, and whether the
outputs are the same (greedy decoding; they can differ in the last digits of a logit between
padded and unpadded batches, which the script reports rather than hides).

Then (tests/evaluation/test_eval_sorted_batches.py) batches of prompts sorted by length vs batches in the split's order
at ``--batch``: padded prompt positions of each (from the tokenizer alone) and the time of each, with
the count of identical outputs. ``--padding-only`` prints the padding and loads no model.
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
from tuneproof.modalities import detect_kind  # noqa: E402
from tuneproof.modalities.batching import length_sorted_batches, padded_positions  # noqa: E402
from tuneproof.modalities.text import CAUSAL_LM, generate  # noqa: E402
from tuneproof.models.base import load_model, load_tokenizer, resolve_base  # noqa: E402
from tuneproof.study import Eval, ModelSpec, Prompt  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=32, help="examples")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument(
        "--padding-only", action="store_true", help="print the padding of sorted vs unsorted batches, load no model"
    )
    args = ap.parse_args()
    examples, _ = load_snips(find_data_root(None, "snips") / "snips")
    examples = stratified_take([e for e in examples if e.split == "validation"], args.n, 0)
    ref = resolve_base(ModelSpec(base="smollm2-135m-instruct"), detect_kind)
    tok = load_tokenizer(ref)
    pipe = TextPipeline(tok, Prompt(system="Reply with JSON only: the intent and the slots of the request."), 128)
    lengths = [len(tok(pipe.prompt_text(e.text), add_special_tokens=False)["input_ids"]) for e in examples]
    for sort in (False, True):
        pad = padded_positions(lengths, length_sorted_batches(lengths, args.batch, sort))
        print(
            f"batch {args.batch} {'sorted by length' if sort else 'in split order'}: {pad} padded of "
            f"{pad + sum(lengths)} prompt "
            f"positions ({pad / (pad + sum(lengths)):.1%})"
        )
    if args.padding_only:
        return
    model = load_model(ref, CAUSAL_LM)
    results = {}
    for bs in (1, args.batch):
        cfg = Eval(batch_size=bs, max_new_tokens=args.max_new_tokens)
        generate(
            model, tok, pipe, examples[:2], cfg, device=torch.device("cpu"), autocast=contextlib.nullcontext
        )  # warm-up
        t = time.perf_counter()
        outs = generate(model, tok, pipe, examples, cfg, device=torch.device("cpu"), autocast=contextlib.nullcontext)
        results[bs] = (time.perf_counter() - t, outs)
        print(
            f"batch {bs:3d}: {results[bs][0]:7.1f} s for {len(examples)} examples = "
            f"{len(examples) / results[bs][0]:.2f} examples/s"
        )
    (t1, o1), (tb, ob) = results[1], results[args.batch]
    same = sum(a == b for a, b in zip(o1, ob))
    print(
        f"speed-up batch {args.batch} vs 1: x{t1 / tb:.2f}; identical outputs {same}/{len(o1)}; "
        f"torch threads {torch.get_num_threads()}"
    )
    cfg = Eval(batch_size=args.batch, max_new_tokens=args.max_new_tokens)
    t = time.perf_counter()
    unsorted = generate(
        model,
        tok,
        pipe,
        examples,
        cfg,
        device=torch.device("cpu"),
        autocast=contextlib.nullcontext,
        sort_by_length=False,
    )
    tu = time.perf_counter() - t
    same = sum(a == b for a, b in zip(unsorted, ob))
    print(
        f"batch {args.batch} in split order: {tu:7.1f} s; sorted by length: {tb:7.1f} s (x{tu / tb:.2f}); "
        f"identical outputs {same}/{len(ob)}"
    )


if __name__ == "__main__":
    main()
