"""The sections ``python scripts/gpu_check.py --all`` adds (see that script's docstring): the training step
vs a plain PEFT loop vs Trainer, ``training.speedups: auto`` and ``training.compile`` on the device, the
chunked loss's and QLoRA's peak memory, the eval batch-invariance check, vLLM's agreement, nccl at world
size 1. Sized for under 8 minutes on one GPU; on a CPU (no CUDA) every section runs a tiny version, a
check of the wiring only. Nothing is downloaded: random Llamas, the tiny word-level tokenizer of the tests.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "training"))  # tiny_study: the word-level tokenizer (no download)

from tuneproof.data.preprocess import collate  # noqa: E402
from tuneproof.models.device import bf16_base_rule, choose_dtype, detect_device  # noqa: E402
from tuneproof.study import Training  # noqa: E402
from tuneproof.training.compiled import prove_compile, record_of  # noqa: E402
from tuneproof.training.loop import _micro_loss  # noqa: E402
from tuneproof.training.loss import chunked_token_loss_sum, token_loss_sum  # noqa: E402
from tuneproof.training.memory import measure_step_peak  # noqa: E402
from tuneproof.training.speedups import resolve_auto, static_rules  # noqa: E402

#: SmolLM2-135M's shape (hidden, MLP, layers, heads, KV heads, vocabulary), random weights; tiny in the dry run
SMOLLM2_SHAPE = (576, 1536, 30, 9, 3, 49152)
TINY_SHAPE = (32, 64, 2, 4, 2, 256)


def default_path(dry: bool) -> Path:
    """``docs/gpu-check-<device>.json`` (``NVIDIA H200`` -> ``h200``); a dry run: a temporary file."""
    if dry:
        return Path(tempfile.gettempdir()) / "gpu-check-cpu-dry-run.json"
    name = torch.cuda.get_device_name(0).lower().replace("nvidia ", "").strip()
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-")
    return ROOT / "docs" / f"gpu-check-{slug}.json"


def _lora_llama(shape, dev, dropout: float = 0.0):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, layers, heads, kv, vocab = shape
    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).to(dev)
    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets, lora_dropout=dropout))


def _examples(n: int, vocab: int, max_len: int, seed: int = 0) -> list:
    """Encoded examples of varied lengths (a quarter to all of ``max_len``), the last quarter supervised."""
    from tuneproof.data.preprocess import Encoded

    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(max_len // 4, max_len + 1, (1,), generator=g))
        ids = torch.randint(3, vocab, (length,), generator=g).tolist()
        cut = length * 3 // 4
        out.append(
            Encoded(
                id=f"ex{i}",
                category=None,
                input_ids=ids,
                labels=[-100] * cut + ids[cut:],
                prompt_tokens=cut,
                answer_tokens=length - cut,
                full_length=length,
                n_supervised=length - cut,
                truncated=False,
                text="",
                boundary_char=0,
            )
        )
    return out


def _autocast(dev, dry: bool):
    if dry:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=dev.type, dtype=torch.bfloat16)


def _sync(dev) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run(out: dict, section, _llama, dev, dry: bool) -> None:
    """Run every ``--all`` section into ``out`` (each records its own error; ``section`` from gpu_check.py)."""
    shape = TINY_SHAPE if dry else SMOLLM2_SHAPE
    vocab = shape[-1]
    steps, mb, length = (3, 2, 32) if dry else (12, 8, 256)
    autocast = _autocast(dev, dry)
    examples = _examples(steps * mb, vocab, length)
    cfg = Training(max_steps=steps, micro_batch_size=mb, learning_rate=2e-4, seed=0, max_length=length)
    from tuneproof.training.data_order import window_at

    idx = [window_at(len(examples), mb, 1, cfg.seed, s)[0] for s in range(steps)]
    batches = [{k: v.to(dev) for k, v in collate([examples[i] for i in ix], 0).items()} for ix in idx]
    real = [int(b["attention_mask"].sum()) for b in batches]

    def rate(times: list[float]) -> dict:
        return {
            "s_per_step": round(statistics.median(times[1:]), 5),
            "tokens_per_s": round(sum(real[1 : len(times)]) / sum(times[1:]), 1),
            "steps_counted": len(times) - 1,
        }

    @section("train_step")
    def _train_step():
        from tuneproof.training.loop import train

        res = {}
        model = _lora_llama(shape, dev)
        stamps = [time.perf_counter()]

        def tick(*_):
            _sync(dev)
            stamps.append(time.perf_counter())

        train(model, examples, cfg, pad_id=0, device=dev, autocast=autocast, progress=tick)
        res["tuneproof"] = rate([b - a for a, b in zip(stamps, stamps[1:])])
        del model
        model = _lora_llama(shape, dev)
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.0)
        times = []
        model.train()
        for b in batches:
            t = time.perf_counter()
            with autocast():
                loss = model(**b).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(dev)
            times.append(time.perf_counter() - t)
        res["plain_peft"] = rate(times)
        del model, opt
        res["trainer"] = rate(_trainer_times(_lora_llama(shape, dev), batches, cfg.learning_rate, dev, dry))
        ref = res["tuneproof"]["tokens_per_s"]
        for v in res.values():
            v["x_of_tuneproof"] = round(v["tokens_per_s"] / ref, 3)
        res["setup"] = {
            "shape": dict(zip(("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab"), shape)),
            "lora": "r16 alpha 32 on q/k/v/o",
            "micro_batch": mb,
            "max_length": length,
            "steps": steps,
            "dtype": "fp32" if dry else "bf16 autocast, fp32 weights",
            "real_tokens": sum(real),
            "padded_positions": sum(int(b["attention_mask"].numel()) for b in batches) - sum(real),
        }
        return res

    @section("speedups_auto")
    def _auto():
        model = _lora_llama(shape, dev)
        info = detect_device()
        choice = choose_dtype("auto", info)
        rules = static_rules(
            device_type=dev.type,
            bf16_base=bf16_base_rule(choice.get("dtype"), info),
            attention=getattr(model.config, "_attn_implementation", None),
            method_kind="lora",
            token_labels=True,
        )
        auto_cfg = cfg.model_copy(update={"speedups": "auto"})
        resolved, record = resolve_auto(
            model,
            examples,
            auto_cfg,
            pad_id=0,
            device=dev,
            loss_fn=lambda m, b: _micro_loss(m, b, autocast),
            fp32_loss_fn=lambda m, b: _micro_loss(m, b, contextlib.nullcontext),
            rules=rules,
        )
        batch = batches[0]
        t = time.perf_counter()
        check = prove_compile(
            model,
            batch,
            lambda m, b: _micro_loss(m, b, autocast, resolved.chunked_loss),
            low_precision=not dry,
            planned_micro_batches=1000,
            device=dev,
            backend="eager" if dry else "inductor",
        )
        return {
            "rules": {k: {"tried": v[0], "why": v[1]} for k, v in rules.items()},
            "resolved": record,
            "compile": {**record_of(check), "passed": check["passed"], "message": check["message"]},
            "compile_check_seconds": round(time.perf_counter() - t, 2),
            "attention": getattr(model.config, "_attn_implementation", None),
        }

    @section("chunked_memory")
    def _chunked():
        b, s = (2, 64) if dry else (4, 512)
        model = _lora_llama(shape, dev)
        model.train()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(3, vocab, (b, s), generator=g).to(dev)
        labels = ids.clone()
        labels[:, : s * 3 // 4] = -100
        mask = torch.ones_like(ids)
        res = {}
        for name in ("full_logits", "chunked"):

            def step(name=name):
                model.zero_grad(set_to_none=True)
                with autocast():
                    if name == "chunked":
                        loss = chunked_token_loss_sum(model, ids, mask, labels)
                    else:
                        loss = token_loss_sum(model(input_ids=ids, attention_mask=mask).logits, labels)
                loss.backward()

            step()  # warm-up
            res[name] = measure_step_peak(step, dev)
        model.zero_grad(set_to_none=True)
        p_full, p_chunk = res["full_logits"].get("peak_bytes"), res["chunked"].get("peak_bytes")
        res["peak_drop_percent"] = round(100 * (1 - p_chunk / p_full), 2) if p_full and p_chunk else None
        res["setup"] = {"micro_batch": b, "seq_len": s, "supervised": "last quarter", "step": "forward + backward"}
        return res

    @section("qlora")
    def _qlora():
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [sys.executable, str(ROOT / "scripts" / "gpu_qlora_check.py"), tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
            path = Path(tmp) / "qlora-check.json"
            import json

            doc = json.loads(path.read_text()) if path.exists() else None
        return {"returncode": proc.returncode, "result": doc, "stderr_tail": proc.stderr[-1500:]}

    @section("eval_batch")
    def _eval_batch():
        from transformers import AutoTokenizer

        from tiny_study import build_base
        from tuneproof.preflight.eval_batch import check_batch_invariance

        with tempfile.TemporaryDirectory() as tmp:
            tok = AutoTokenizer.from_pretrained(build_base(Path(tmp) / "base"))
        tok.padding_side = "left"
        model = _lora_llama((*shape[:5], len(tok)), dev).eval()
        words = "alpha beta gamma delta omega sun moon star rain snow wind cold warm red blue green".split()
        prompts = [" ".join(words[(i * 3) % 16 : (i * 3) % 16 + 1 + i % 9]) for i in range(16)]

        def predict(items, batch_size):
            outs = []
            for i in range(0, len(items), batch_size):
                enc = tok(items[i : i + batch_size], return_tensors="pt", padding=True).to(dev)
                with torch.no_grad(), autocast():
                    gen = model.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
                outs += tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            return outs

        return check_batch_invariance(predict, prompts, 8, ids=[f"p{i}" for i in range(16)])

    @section("vllm")
    def _vllm():
        try:
            import vllm  # noqa: F401
        except Exception as err:  # noqa: BLE001 - not installed (or broken): recorded
            return {"skipped": f"vllm does not import here: {err!r}"}
        if dry:
            return {"skipped": "vllm imports, but its backend check needs a GPU"}
        from vllm import LLM, SamplingParams

        from tiny_study import build_base

        with tempfile.TemporaryDirectory() as tmp:
            base = build_base(Path(tmp) / "base")
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(base)
            tok.padding_side = "left"
            hf = AutoModelForCausalLM.from_pretrained(base).to(dev).eval()
            prompts = ["alpha beta", "sun moon star", "rain snow wind cold", "red blue green"]
            want = []
            for p in prompts:
                enc = tok(p, return_tensors="pt").to(dev)
                with torch.no_grad():
                    g = hf.generate(**enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id)
                want.append(tok.decode(g[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))
            llm = LLM(model=str(base), dtype="float32", gpu_memory_utilization=0.3, enforce_eager=True)
            got = [o.outputs[0].text for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8))]
        agree = sum(a.strip() == b.strip() for a, b in zip(want, got))
        return {"version": vllm.__version__, "agreement": f"{agree}/{len(prompts)}", "transformers": want, "vllm": got}

    @section("nccl_world1")
    def _nccl():
        import torch.distributed as dist

        backend = "gloo" if dry else "nccl"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        t = time.perf_counter()
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
        try:
            x = torch.arange(4.0, device=dev)
            dist.all_reduce(x)
            dist.barrier()
            ok = x.tolist() == [0.0, 1.0, 2.0, 3.0]
        finally:
            dist.destroy_process_group()
        return {"backend": backend, "all_reduce_ok": ok, "seconds": round(time.perf_counter() - t, 3)}

    out["all"] = {"python": sys.version.split()[0], "torch": torch.__version__, "pid": os.getpid()}


def _trainer_times(model, batches, lr, dev, dry: bool) -> list[float]:
    from torch.utils.data import SequentialSampler
    from transformers import Trainer, TrainerCallback, TrainingArguments

    cpu = [{k: v.cpu() for k, v in b.items()} for b in batches]

    class Pre(torch.utils.data.Dataset):
        def __len__(self):
            return len(cpu)

        def __getitem__(self, i):
            return cpu[i]

    class InOrder(Trainer):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            _sync(dev)
            stamps[-1] = time.perf_counter() - stamps[-1]

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp,
            max_steps=len(cpu),
            per_device_train_batch_size=1,
            learning_rate=lr,
            lr_scheduler_type="linear",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            save_strategy="no",
            report_to=[],
            logging_strategy="no",
            use_cpu=dry,
            bf16=not dry,
            dataloader_num_workers=0,
            remove_unused_columns=False,
            disable_tqdm=True,
            seed=0,
        )
        InOrder(
            model=model, args=args, train_dataset=Pre(), data_collator=lambda items: items[0], callbacks=[Clock()]
        ).train()
    return stamps
