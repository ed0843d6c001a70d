"""Recipe ``data check``: the data protocol's evidence before any compute (docs/PROTOCOL.md step 3).

Features:
- data version: fingerprint of the cleaned examples + ordered cleaning rules + preprocessing
  config; frozen split manifest (created or reused) and how ``data.split.max_examples`` drew its
  subsets (``data.split.subset``, recorded in ``splits.json``); encoding repairs (docs/CASES.md C17);
- duplicates: exact, normalised and MinHash near-duplicates across every pair of splits and
  inside train (``data.dedup``; BANKING77 train/test overlap, docs/CASES.md C14);
- paraphrase leaks (``data.dedup.semantic``, off unless set): pairs of a train example and an evaluated
  example whose all-MiniLM-L6-v2 embeddings have cosine >= the threshold, listed with both texts in
  ``semantic_dedup`` (docs/semantic-dedup.md); a warning when any; ``policy: drop-from-train`` removes them;
- audits, by the task kind's own ``audit`` (``tuneproof.tasks``): class counts and imbalance, classes
  missing from a split, same text with different labels; extraction: targets that are not strict
  JSON (docs/CASES.md C16), missing required fields; format: gold targets checked against the study's own
  format rule (``eval.json_schema`` / ``eval.regex`` / ``eval.grammar``), parse rate and failing
  lines; multi-label (and list-valued intents): support per label, label-set cardinality;
- the exact preprocessing of the trainer on every train and eval example: 0 supervised tokens
  (docs/CASES.md C4), end token not supervised (docs/CASES.md C2), boundary inside a token (docs/CASES.md C3), prefix
  mismatch, an empty inference prompt or one without the input, a training text without the answer, the input
  supervised (docs/CASES.md C3 kind);
- the chat template (``model.chat_template``, ``model.chat_template_kwargs``, ``model.end_of_turn``,
  ``data/chat_template.py``): which template, the end-of-turn token and how it was chosen, a system role
  folded or dropped; text supervised before every answer (an empty think block, channel markers) with its
  token count and the key that removes it; the gold chain (each reference given back by decoding and
  parsing its supervised span as the evaluation does, ``eval.answer_from``); faults: a special token's text
  inside a target or input (the row named), a system message missing from the render, a generation prompt
  that opens a think block the training render does not close, text injected by the template that differs
  between two renders of the same example (the key that pins it);
- token lengths per split (p50, p95, max), share truncated, suggested max_length (never below the
  length that keeps every answer whole);
- checks that state their result also when they find nothing (``checks``): empty texts dropped by
  the cleaning rules (file:line of each), duplicates across splits, classes under
  ``data.min_class_examples`` in train and the eval split, answers cut by ``training.max_length``
  (count, ids, answer tokens lost), reference answers of the eval split longer than
  ``eval.max_new_tokens`` (count and the budget that keeps them whole), optional keys absent, and per
  per-class / per-field guard how many classes (fields) the evaluated examples can judge at its
  ``min_support`` (a warning when none or fewer than half).
- the hypothesis against the data, before the run (bad input, exit 2): a guard's ``classes`` that
  are not labels, a format rule (``eval.regex`` / ``eval.json_schema``) no gold target satisfies;
  ``eval.sets`` read and checked (a missing file, a row without its text column, an empty set, a set guard that
  needs references on a set without them), then each set's size, references and sha256 on screen and in the report.
Hard faults fail the run (exit 3) after the report is written.
"""

from __future__ import annotations

from typing import Any

from tuneproof.context import StudyContext
from tuneproof.data import checks
from tuneproof.data.chat import chat_summary
from tuneproof.data.checks import audit_lines, fault_lines
from tuneproof.data.cleaning import dropped_summary
from tuneproof.data.dedup import find_duplicates
from tuneproof.data.examples import natural_key
from tuneproof.data.languages import tokenizer_loss
from tuneproof.data.lengths import length_stats
from tuneproof.data.preprocess import visible
from tuneproof.data.semantic_dedup import find_semantic_duplicates, minilm_embed, semantic_settings
from tuneproof.data.split import MANIFEST, subset_line
from tuneproof.errors import CheckFailed
from tuneproof.evaluation.compare import guard_support
from tuneproof.hypothesis import check_against_data
from tuneproof.io import read_json
from tuneproof.modalities.modality import IMAGE_FORM, TEXT_CHECK_LINES, TEXT_CHECKS, TOKEN_LENGTHS
from tuneproof.recipes.common import record_inputs
from tuneproof.study import STUDY_FILE
from tuneproof.tasks import get_task, task_config
from tuneproof.training.budget import total_steps, warmup_finding
from tuneproof.ui import capped, console, fmt, heartbeat, progress_bar, table, user_text, visible_text

#: examples encoded between two progress updates of the data check
ENCODE_CHUNK = 256


def data_report(ctx: StudyContext) -> dict[str, Any]:
    """Build the data check report (JSON-safe); no registry side effects."""
    s = ctx.study
    splits = ctx.all_splits
    d = s.data.dedup
    to_encode = {name: items for name, items in splits.items() if name != s.data.test_split}
    n_all = sum(len(v) for v in splits.values())
    # progress over the two long parts on a large set: duplicates (all splits, one step) and the trainer's encoding
    with progress_bar("data check", n_all + sum(len(v) for v in to_encode.values())) as advance:
        advance(0, "finding duplicates")  # what the lines off a terminal say until it is done
        # text duplicates (an image study's are found by the image audit, on the pixels, not the paths)
        dedup = find_duplicates(
            ctx.modality.duplicate_input(splits),
            threshold=d.threshold,
            shingles=d.shingles,
            ngram=d.ngram,
            num_perm=d.num_perm,
        )
        advance(n_all, "duplicates done")
        semantic = None
        texts = ctx.modality.duplicate_input(splits)
        if d.semantic is not None and any(texts.values()):  # paraphrase leaks: sentence encoder, off unless set
            advance(0, "semantic duplicates (all-MiniLM-L6-v2)")
            semantic = find_semantic_duplicates(
                texts, d.semantic.threshold, minilm_embed(d.semantic.batch_size), settings=semantic_settings(d.semantic)
            )
        encoded = {}
        for name, items in to_encode.items():
            out = encoded[name] = []
            for i in range(0, len(items), ENCODE_CHUNK):
                out += ctx.pipeline.encode_all(items[i : i + ENCODE_CHUNK])
                advance(len(items[i : i + ENCODE_CHUNK]), f"encoding {name}")
    kind = get_task(ctx.task)
    # the task kind's own audit (labels, targets, label sets) and the modality's (images: form, duplicates, shortcuts)
    with heartbeat("data check", "auditing labels, targets and inputs"):  # images: every file decoded
        audit = ctx.modality.audit(kind, splits, task_config(ctx), ctx.pipeline)
    faults = [
        {
            "id": e.id,
            "split": name,
            "prompt_tokens": e.prompt_tokens,
            "answer_tokens": e.answer_tokens,
            "fault": f,
            **({"prefix_diff": e.prefix_diff} if e.prefix_diff and "inference prompt" in f else {}),
        }
        for name, items in encoded.items()
        for e in sorted(items, key=lambda e: natural_key(e.id))  # chats:2 before chats:10
        for f in e.faults
    ]
    generative = ctx.pipeline.labels is None
    lengths = length_stats(
        {name: [e.full_length for e in items] for name, items in encoded.items()},
        s.training.max_length,
        keep_whole={n: [e.full_length for e in v] for n, v in encoded.items()} if generative else None,
    )
    checks = _checks(ctx, dedup, encoded, generative)
    if generative and hasattr(ctx.pipeline, "template_report"):  # the chat template, end of turn, gold chain
        tpl = ctx.pipeline.template_report([e for v in encoded.values() for e in v])
        checks["lines"] = tpl["lines"] + checks["lines"]
        checks["warnings"] += tpl["warnings"]
    if semantic is not None:
        checks["lines"].insert(2, "paraphrases across splits: " + "; ".join(semantic.summary_lines()))
    t = audit.get("targets")
    json_targets = (
        t if t and "parsed" in t and "rule" not in t else None
    )  # format rules and label sets have their own lines
    checks["lines"] += audit_lines(audit.get("labels") or {}, json_targets, faults, lengths)
    hard = list(audit["hard_faults"]) + [f"{f['split']}/{f['id']}: {f['fault']}" for f in faults]
    warnings = (
        list(audit["warnings"])
        + lengths.get("warnings", [])
        + [line for line in dedup.summary_lines() if "no duplicates" not in line]
        + ([f"paraphrase leak: {x}" for x in semantic.summary_lines() if "no paraphrase" not in x] if semantic else [])
        + checks["warnings"]
        + _warmup_warnings(s, splits)
    )
    return {
        "fingerprint": ctx.data_fingerprint(),
        "manifest_created": getattr(ctx, "manifest_created", None),
        "sizes": {n: len(v) for n, v in splits.items()},
        "repairs": ctx.repairs,
        "dropped_by_dedup": getattr(ctx, "dedup_dropped", []),
        "dedup": dedup.to_dict(),
        "semantic_dedup": semantic.to_dict() if semantic is not None else None,
        "labels": audit.get("labels"),
        "targets": audit.get("targets"),
        "label_sets": audit.get("label_sets"),
        "images": audit.get("images"),
        "encoding_faults": faults,
        # the template rendered, its kwargs, end of turn and system role (data/chat_template.py)
        "chat_template": ctx.pipeline.chat.record() if generative and hasattr(ctx.pipeline, "chat") else None,
        "lengths": lengths,
        "supervised_tokens": {n: sum(e.n_supervised for e in v) for n, v in encoded.items()},
        "small_classes": checks["small_classes"],
        "cut_answers": checks["cut_answers"],
        "guard_support": checks["guard_support"],
        "generation_budget": checks["generation_budget"],
        "optional_absent": checks["optional_absent"],
        "chat": checks["chat"],
        "tokenizer_loss": checks["tokenizer_loss"],
        "checks": checks["lines"],
        "hard_faults": hard,
        "warnings": warnings,
        "passed": not hard,
    }


def _warmup_warnings(s, splits: dict) -> list[str]:
    """``training.warmup_steps`` against the optimizer steps of the budget on the train split (one process)."""
    if not splits.get("train"):
        return []
    line = warmup_finding(s.training, total_steps(s.training, len(splits["train"])))
    return [line] if line else []


def _checks(ctx: StudyContext, dedup, encoded: dict, generative: bool) -> dict[str, Any]:
    s = ctx.study
    small = checks.small_classes(ctx.all_splits, s.eval.split, s.data.min_class_examples)
    cut = checks.cut_answers(encoded, s.training.max_length) if generative else None
    absent = checks.absent_optional(ctx.all_splits, s.data.fields.optional)
    # the generation budget against the gold answers of the split that is generated (eval and test use the same budget)
    budget = (
        checks.cut_by_generation(
            encoded[s.eval.split],
            s.eval.split,
            s.eval.max_new_tokens,
            getattr(ctx.pipeline, "end_token", None) is not None,
            {e.id for e in ctx.eval_examples()} if s.eval.max_examples else None,
        )
        if generative and s.eval.split in encoded
        else None
    )
    guards = _guard_support(ctx)
    lines = [dropped_summary(getattr(ctx, "dropped_empty", [])), checks.duplicates_line(dedup)]
    manifest = ctx.study_dir / MANIFEST
    caps = subset_line(read_json(manifest), s.data.split) if manifest.exists() else None
    lines += [caps] if caps else []
    resplit = getattr(ctx, "split_info", {}).get("resplit")
    if resplit:
        lines.append(f"{MANIFEST} cut again (no run had used it): " + "; ".join(resplit))
    legacy = getattr(ctx, "split_info", {}).get("legacy_ids")
    if legacy:
        lines.append(
            f"example ids: {legacy} JSON Lines examples keep the 0-based ids of this study's {MANIFEST} (written "
            "before ids followed file lines: d:2 is d.jsonl:3), so its runs stay comparable; new studies number by line"
        )
    chat = chat_summary(ctx.all_splits, encoded, s.data.chat.train_on)
    tok = getattr(ctx.pipeline, "tok", None)  # text studies: what the tokenizer loses of the language
    lost = tokenizer_loss(tok, _texts(ctx.all_splits, s.data.test_split)) if tok is not None else None
    lines += [x for x in (small["line"], cut and cut["line"], budget and budget["line"], absent["line"]) if x]
    lines += [chat["line"]] if chat else []
    lines += [lost["line"]] if lost and lost["line"] else []
    lines += [g["line"] for g in guards]
    return {
        "lines": lines,
        "warnings": small["warnings"]
        + ([cut["line"]] if cut and cut["count"] else [])
        + ([budget["line"]] if budget and budget["count"] else [])
        + [g["line"] for g in guards if g["warn"]]
        + (lost["warnings"] if lost else []),
        "guard_support": guards,
        "small_classes": small,
        "cut_answers": cut,
        "generation_budget": budget,
        "optional_absent": absent,
        "chat": chat,
        "tokenizer_loss": lost,
    }


def _texts(splits: dict[str, list], test_split: str) -> list[str]:
    """Every text the model reads or writes outside the reserved split: inputs, references, chat turns."""
    out = []
    for name, items in splits.items():
        if name == test_split:
            continue
        for e in items:
            out += [e.text, *(t["content"] for t in e.context)] + ([e.target] if isinstance(e.target, str) else [])
    return out


def _guard_support(ctx: StudyContext) -> list[dict]:
    """Per guard on classes or fields: how many the evaluated examples can judge (``guard_support``)."""
    s = ctx.study
    if not any(g.metric.startswith(("per_class_", "per_field_")) for g in s.hypothesis.guards):
        return []
    # what baseline, eval and test will predict (each capped by eval.max_examples)
    test = s.eval.split == s.data.test_split
    items = ctx.test_examples() if test else ctx.eval_examples()
    return guard_support(s.hypothesis, ctx.task, items, task_config(ctx), s.eval.split)


def run_data_check(ctx: StudyContext) -> str:
    """Run the data check as a registry run; raises :class:`CheckFailed` (exit 3) on hard faults."""
    notes = check_against_data(
        ctx.study, ctx.all_splits, ctx.study_dir / STUDY_FILE
    )  # bad input: exit 2 before any run
    sets = ctx.eval_sets  # eval.sets read and checked (exit 2 before any run): a missing file, no text column ...
    with ctx.registry.run("data-check") as run:
        record_inputs(ctx, run)
        rep = data_report(ctx)
        rep["hypothesis_notes"] = notes
        if sets:
            rep["eval_sets"] = {s.name: s.fingerprint_entry() for s in sets}
            run.update_summary(eval_sets={s.name: len(s.examples) for s in sets})
        rep["warnings"] += notes
        run.write_json("data_check.json", rep)
        run.update_summary(
            passed=rep["passed"],
            hard_faults=len(rep["hard_faults"]),
            sizes=rep["sizes"],
            lengths={
                k: {m: v.get(m) for m in ("p50", "p95", "max", "truncated_share")}
                for k, v in rep["lengths"]["splits"].items()
            },
            suggest_max_length=rep["lengths"].get("suggest_max_length"),
            duplicates=[
                line for line in rep["warnings"] if "overlap" in line or "duplicate" in line or "paraphrase" in line
            ][:6],
            checks=rep["checks"],
        )
        _print(rep, ctx.modality.dossier_sections)
        for s in sets:
            console.print(
                f"eval.sets '{user_text(s.name)}': {len(s.examples)} prompts, "
                f"{'with references' if s.has_references else 'no references (agreement only)'}, "
                f"sha256 {s.sha256[:12]}",
                soft_wrap=True,
            )
        if not rep["passed"]:
            raise CheckFailed(
                f"data check {run.id}: {len(rep['hard_faults'])} hard faults, first: {rep['hard_faults'][0]}",
                hint=f"see {run.path('data_check.json')}",
            )
        return run.id


def target_lines(rep: dict[str, Any]) -> list[str]:
    """Plain lines for the target audit (parse rate under the study's rule) and the per-label audit
    of a multi-label field; each states its result when it finds nothing wrong too."""
    out = []
    t = rep.get("targets") or {}
    if "rule" in t:  # a format study: gold targets under the study's own rule (strict-JSON targets: see the checks)
        rule = t["rule"]
        out.append(
            f"targets: {t.get('parsed')} of {t.get('n')} follow {rule} (parse rate {t['parse_rate']:.1%})"
            + ("" if t.get("invalid") else "; none fails")
        )
    ls = rep.get("label_sets")
    if ls:
        for split, sup in ls["support"].items():
            c = ls["cardinality"][split]
            mean = "n/a" if c["mean"] is None else f"{c['mean']:.2f}"
            out.append(
                f"label sets {split}: {len(sup)} labels, labels per example mean "
                f"{mean} (min {c['min']}, max {c['max']}); "
                "support: " + capped([f"{k} {v}" for k, v in sup.items()])
            )
    return out


def _print(rep: dict[str, Any], sections: tuple[str, ...]) -> None:
    """The data check's screen; ``sections``: the modality's (``Modality.dossier_sections``)."""
    console.print(
        f"data fingerprint {rep['fingerprint']['hash'][:16]}; splits "
        + user_text(", ".join(f"{k} {v}" for k, v in rep["sizes"].items())),
        soft_wrap=True,
    )
    for r in rep["repairs"]:
        if r.startswith("skipped "):  # an unreadable image: left out and counted, not repaired
            console.print(f"[yellow]skipped[/] {user_text(r[len('skipped ') :])}", soft_wrap=True)
        elif r.startswith("allowed "):  # images read from outside the data folder (data.image.allow_outside_paths)
            console.print(f"[yellow]allowed[/] {user_text(r[len('allowed ') :])}", soft_wrap=True)
        else:
            console.print(f"[yellow]repaired[/] {user_text(r)}", soft_wrap=True)
    if IMAGE_FORM in sections:
        _print_images(rep["images"])
    if TOKEN_LENGTHS in sections:
        rows = [
            [
                user_text(k, one_line=True),
                fmt(v.get("p50"), 0),
                fmt(v.get("p95"), 0),
                v.get("max"),
                fmt(v.get("truncated_share")),
            ]
            for k, v in rep["lengths"]["splits"].items()
        ]
        console.print(
            table(
                f"token lengths (max_length {rep['lengths']['max_length']}, "
                f"suggested {rep['lengths'].get('suggest_max_length')})",
                ["split", "p50", "p95", "max", "truncated share"],
                rows,
            )
        )
    warned = set(rep["warnings"])
    lines = [c for c in rep.get("checks", []) if TEXT_CHECKS in sections or not c.startswith(TEXT_CHECK_LINES)]
    for c in target_lines(rep) + lines:
        if c in warned or all(part in warned for part in c.split("; ")):  # said once, as the warning(s) below
            continue
        console.print("[cyan]check[/] " + user_text(c), soft_wrap=True)
    for w in rep["warnings"]:
        console.print(f"[yellow]warning[/] {user_text(w)}", soft_wrap=True)
    diff = next((f for f in rep["encoding_faults"] if f.get("prefix_diff")), None)
    if diff is not None:
        _print_prefix_diff(diff["id"], diff["prefix_diff"])
    for h in fault_lines(rep["hard_faults"], rep["encoding_faults"])[:20]:  # one line per distinct fault
        console.print(f"[red]fault[/] {user_text(h)}", soft_wrap=True)
    console.print(
        "[green]data check passed[/]"
        if rep["passed"]
        else f"[red]data check failed: {len(rep['hard_faults'])} hard faults[/]"
    )


def _print_images(images: dict[str, Any]) -> None:
    """Per split and class: images, median size, modes, and the tensor the model receives; then the
    duplicates and shortcut lines (each states its result when it finds nothing)."""
    rows = []
    for split, form in images["form"].items():
        for label, c in form["categories"].items():
            after = (c.get("after_transform") or {}).get("outputs") or {}
            rows.append(
                [
                    user_text(split, one_line=True),
                    user_text(label, one_line=True),
                    c["n"],
                    f"{c['width']['median']:g}x{c['height']['median']:g}",
                    ", ".join(f"{m} {n}" for m, n in c["modes"].items()),
                    ", ".join(after),
                ]
            )
    console.print(
        table(
            "images per class (median size, PIL modes, model input)",
            ["split", "class", "n", "size", "modes", "model input"],
            rows,
            keep=("split", "class"),
        )
    )
    console.print(
        "[cyan]check[/] "
        + user_text(images["duplicates"]["summary"])
        + f" ({user_text(images['duplicates']['rule'])})",
        soft_wrap=True,
    )
    console.print("[cyan]check[/] " + user_text(images["shortcut"]["message"]), soft_wrap=True)


def _print_prefix_diff(ex_id: str, d: dict[str, Any]) -> None:
    """Training prefix vs inference prompt (docs/CASES.md C3 kind): both strings and the character diff."""
    console.print(
        f"[red]training prefix differs from the inference prompt[/] ({user_text(ex_id, one_line=True)}, "
        "first difference at character "
        f"{d['first_difference']}):",
        soft_wrap=True,
    )
    console.print(
        f"  inference prompt: {visible_text(visible(d['prompt']))}", soft_wrap=True, markup=False, highlight=False
    )
    console.print(
        f"  training prefix:  {visible_text(visible(d['training_prefix']))}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
    console.print(
        f"  diff ([-prompt only-] {{+training only+}}): {visible_text(d['diff'])}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )
