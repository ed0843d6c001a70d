"""Task kind ``format``: outputs that follow the study's own format rule.

Parts in the order every task module has them (see :mod:`tuneproof.tasks.task`): reader,
labels, scorer, bootstrap statistics, per-example rule, audit, template.

The format rule (:class:`FormatRule`) is what the study writes, any combination of:

- ``eval.json_schema``: strict JSON that satisfies a JSON Schema (``jsonschema``, the draft named
  by ``$schema``, default the latest); ``hypothesis.required_fields``: top-level keys;
- ``eval.regex``: a regular expression the stripped output must match entirely
  (``fullmatch`` with a time limit, :mod:`tuneproof.patterns`); its *named groups* are the rule's parts,
  each scored for accuracy;
- ``eval.grammar: function_slots``: a meaning representation ``name(slot[value], slot[v1, v2])``
  as in the E2E / ViGGO data-to-text sets, e.g. ``inform(name[Dirt: Showdown],
  release_year[2012], genres[driving/racing, sport])``. Its parts are the function name (the
  dialogue act; it is the category of per-class metrics) and the slots, scored as (slot, item)
  pairs (a bracket's comma-separated items, stripped + casefolded, order-free) with precision,
  recall and F1.

A per-example ``correct`` is the right answer, not only a well-formed one: a valid output equal to
the reference under the rule (same JSON object; same string for a regex; same function and the same
multiset of slots, values compared as sets, for a grammar). A duplicated or invented slot is valid
but wrong.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tuneproof.data.audit import audit_format_targets, audit_labels
from tuneproof.errors import TuneproofError
from tuneproof.patterns import compile_pattern, fullmatch
from tuneproof.tasks.parsing import parse_json_output
from tuneproof.tasks.task import (
    PASS_F1,
    BootstrapStats,
    ExampleRule,
    ReaderHints,
    Task,
    TaskConfig,
    col,
    copy_records,
    div,
    example_f1,
    f1,
    multihot,
    names,
    onehot,
    ratio,
    text,
)

GRAMMARS = ("function_slots",)
_FUNC = re.compile(r"\s*(?P<fn>[A-Za-z_][\w.\-]*)\s*\((?P<body>.*)\)\s*", re.DOTALL)
_SLOT = re.compile(r"\s*(?P<name>[A-Za-z_][\w.\-]*(?: [\w.\-]+)*)\s*\[(?P<value>[^\[\]]*)\]\s*")
_RATES = {
    "json_valid": "json_valid_rate",
    "schema_valid": "schema_valid_rate",
    "regex_match": "regex_match_rate",
    "grammar_valid": "grammar_valid_rate",
    "required_present": "required_fields_rate",
}


# --------------------------------------------------------------------------- the format rule
def parse_function_slots(s: str) -> tuple[dict | None, str | None]:
    """Parse ``name(slot[value], slot[v1, v2], ...)``.

    Returns ``({"function": name, "slots": [(slot, (item, ...)), ...]}, None)`` with items
    stripped and casefolded, sorted, or ``(None, reason)`` where reason says where parsing
    stopped, e.g. ``"grammar: expected slot[value] at character 12"``.
    """
    m = _FUNC.fullmatch(s or "")
    if m is None:
        return None, "grammar: expected name(slot[value], ...)"
    body, pos, slots = m.group("body"), 0, []
    offset = m.start("body")
    while pos < len(body) and body[pos:].strip():
        sm = _SLOT.match(body, pos)
        if sm is None:
            return None, f"grammar: expected slot[value] at character {offset + pos + 1}"
        items = tuple(sorted(x.strip().casefold() for x in sm.group("value").split(",") if x.strip()))
        slots.append((sm.group("name").strip(), items))
        pos = sm.end()
        if pos < len(body):
            if body[pos] != ",":
                return None, f"grammar: expected ',' at character {offset + pos + 1}"
            pos += 1
            if not body[pos:].strip():
                return None, f"grammar: trailing ',' at character {offset + pos}"
    return {"function": m.group("fn"), "slots": slots}, None


class FormatRule:
    """The study's format rule, compiled once.

    Raises:
        TuneproofError: no rule configured, an invalid JSON Schema (``eval.json_schema``), regex
            (``eval.regex``) or an unknown grammar (``eval.grammar``).
    """

    def __init__(
        self,
        json_schema: dict | None = None,
        regex: str | None = None,
        grammar: str | None = None,
        required_fields: Sequence[str] | None = None,
        allow_fenced: bool = False,
    ):
        self.required = list(required_fields or [])
        self.json_mode = json_schema is not None or bool(self.required)
        self.allow_fenced = allow_fenced
        if json_schema is None and regex is None and grammar is None and not self.required:
            raise TuneproofError(
                "a format study needs a check: none of eval.json_schema, eval.regex, "
                "eval.grammar, hypothesis.required_fields is set",
                hint="set eval.json_schema, eval.regex or eval.grammar in the study file",
            )
        self.validator = None
        if json_schema is not None:
            import jsonschema  # noqa: PLC0415 - jsonschema loads only when __init__() runs

            try:
                cls = jsonschema.validators.validator_for(json_schema)
                cls.check_schema(json_schema)
            except jsonschema.SchemaError as err:
                raise TuneproofError(f"eval.json_schema: not a valid JSON Schema ({err.message})") from None
            self.validator = cls(json_schema)
        self.pattern = None
        if regex is not None:
            self.pattern = compile_pattern(regex, "eval.regex")
        if grammar is not None and grammar not in GRAMMARS:
            raise TuneproofError(f"eval.grammar: unknown grammar '{grammar}'", hint=f"use one of {', '.join(GRAMMARS)}")
        self.grammar = grammar
        self.parts = list(self.pattern.groupindex) if self.pattern is not None else []

    @classmethod
    def from_config(cls, cfg: TaskConfig) -> FormatRule:
        e = cfg.eval
        return cls(e.json_schema, e.regex, getattr(e, "grammar", None), cfg.required_fields, e.allow_fenced_json)

    @property
    def checks(self) -> list[str]:
        return (
            (["json_schema"] if self.validator else [])
            + (["regex"] if self.pattern else [])
            + (["grammar"] if self.grammar else [])
            + (["required_fields"] if self.required else [])
        )

    def describe(self) -> str:
        out = []
        if self.validator is not None:
            out.append("eval.json_schema")
        if self.pattern is not None:
            out.append(
                f"eval.regex {self.pattern.pattern!r}" + (f" (parts: {', '.join(self.parts)})" if self.parts else "")
            )
        if self.grammar:
            out.append(f"eval.grammar {self.grammar}")
        if self.required:
            out.append(f"required fields {self.required}")
        return " and ".join(out)

    def accepts_empty(self) -> list[str]:
        """The empty answers this rule, applied alone, would let through: ``''`` or a whitespace-only
        text (``eval.regex``, e.g. ``.*`` or ``\\d*``), or the empty JSON string ``""`` (``eval.json_schema``,
        e.g. ``{"type": "string"}``); [] when it accepts none. :meth:`check` never passes them (an
        empty answer is never compliant); the data check warns when this list is not empty."""
        out = []
        if self.pattern is not None:
            out += [repr(t) for t in ("", " ") if fullmatch(self.pattern, t, "eval.regex") is not None][:1]
        if self.validator is not None and not self.required:
            for value, shown in (("", '""'), (" ", '" "')):
                if self.validator.is_valid(value):
                    out.append(f"the JSON string {shown}")
                    break
        return out

    def check(self, s: str, *, fenced_ok: bool | None = None) -> dict[str, Any]:
        """Apply the rule to one text. Returns ``{"ok", "error", "scores", "obj", "parts",
        "function", "slots"}``; ``scores`` holds one boolean per check (``json_valid``,
        ``schema_valid``, ``regex_match``, ``grammar_valid``, ``required_present``) and the
        first error (``parse_error`` / ``schema_error``).

        An empty answer is never compliant, whatever the rule accepts (:meth:`accepts_empty`): an
        empty or whitespace-only text, or in JSON mode a JSON string that is empty or whitespace
        (``scores["empty"]`` True, error ``empty: ...``); every check that would pass it fails."""
        allow = self.allow_fenced if fenced_ok is None else fenced_ok
        sc: dict[str, Any] = {}
        ok, error, obj, parts, parsed = True, None, None, None, None
        if not (s or "").strip():
            ok, error = False, "empty: the output is empty or whitespace only"
        if self.json_mode:
            obj, err = parse_json_output(s, allow_fenced=allow)
            if err is None and isinstance(obj, str) and not obj.strip():
                ok, error = False, error or "empty: the output is an empty JSON string"
            sc["json_valid"], sc["parse_error"] = err is None, err
            ok &= err is None
            error = error or err
            if self.validator is not None:
                errors = [] if err is not None else sorted(self.validator.iter_errors(obj), key=lambda e: list(e.path))
                sc["schema_valid"] = err is None and not errors
                sc["schema_error"] = err if err is not None else (errors[0].message if errors else None)
                ok &= sc["schema_valid"]
                error = error or sc["schema_error"]
            if self.required:
                sc["required_present"] = err is None and isinstance(obj, dict) and all(k in obj for k in self.required)
                ok &= sc["required_present"]
                if not sc["required_present"] and error is None:
                    error = f"missing_fields: required top-level keys missing: {self.required}"
        stripped = (s or "").strip()
        if self.pattern is not None:
            m = fullmatch(self.pattern, stripped, "eval.regex")
            sc["regex_match"] = m is not None
            ok &= m is not None
            if m is None:
                error = error or f"regex: does not match eval.regex {self.pattern.pattern!r}"
            elif self.parts:
                parts = {k: (v or "").strip() for k, v in m.groupdict().items()}
        if self.grammar:
            parsed, err = parse_function_slots(stripped)
            sc["grammar_valid"] = parsed is not None
            ok &= parsed is not None
            error = error or err
        if error is not None and error.startswith("empty:"):  # no check passes an empty answer, no part is right
            sc = {k: (False if isinstance(v, bool) else v) for k, v in sc.items()}
            parts = None
        sc["empty"] = error is not None and error.startswith("empty:")
        return {
            "ok": bool(ok),
            "error": None if ok else (error or "not compliant"),
            "scores": sc,
            "obj": obj,
            "parts": parts,
            "parsed": parsed,
        }


# --------------------------------------------------------------------------- scorer
def score_format(
    records: Sequence[dict],
    json_schema: dict | None = None,
    regex: str | None = None,
    allow_fenced: bool = False,
    required_fields: Sequence[str] | None = None,
    grammar: str | None = None,
) -> tuple[list[dict], dict]:
    """Score outputs against the format rule (see the module docstring) and the reference.

    Per example ``scores`` holds ``compliant``, ``exact``, one boolean per configured check
    (``json_valid`` / ``parse_error``, ``schema_valid`` / ``schema_error``, ``regex_match``,
    ``grammar_valid``, ``required_present``), ``error`` (why it is not compliant); with regex
    named groups ``parts`` (``{part: bool}``, only when the reference matches) and
    ``part_accuracy``; with a grammar ``function_correct``, ``tp`` / ``fp`` / ``fn`` (slot
    items), ``slot_f1`` (0 for an invalid output), ``slot_names`` (``{slot: [tp, fp, fn]}``),
    ``duplicated_slots`` and ``invented_slots`` (slot names the output repeats, or that the
    reference does not have). ``correct`` = ``exact``.

    Returns:
        ``(records, metrics)`` with ``task``, ``n``, ``checks``, ``rule``, ``compliance_rate``,
        ``exact_match`` and per configured check its rate (``json_valid_rate``,
        ``schema_valid_rate``, ``regex_match_rate``, ``grammar_valid_rate``,
        ``required_fields_rate``); with parts ``part_accuracy`` (right parts / parts of the
        references that match the rule) and ``per_field`` (``{part: {"accuracy", "support"}}``);
        with a grammar ``function_accuracy``, ``slot_precision``, ``slot_recall``, ``slot_f1``
        (micro over slot items), ``n_duplicated_slots``, ``n_invented_slots`` and ``per_field``
        (``{slot: {"precision", "recall", "f1", "support"}}``); ``per_class`` per category (the
        reference's function name under a grammar, else the record ``category``; ``{"support",
        "compliance_rate", "exact_match"}`` + ``part_accuracy`` / ``slot_f1``).

    Raises:
        TuneproofError: no rule configured, an invalid rule, or no records.
    """
    recs = copy_records(records)
    rule = FormatRule(json_schema, regex, grammar, required_fields, allow_fenced)
    counts: Counter = Counter()
    per_class: dict[str, Counter] = {}
    part_right: Counter = Counter()
    part_has: Counter = Counter()
    slot_counts: dict[str, Counter] = {}
    for r in recs:
        pred_text, ref_text = text(r.get("prediction")), text(r.get("reference"))
        p = rule.check(pred_text)
        g = rule.check(ref_text, fenced_ok=False)
        sc = dict(p["scores"])
        ok = p["ok"]
        exact = ok and pred_text.strip() == ref_text.strip()
        if rule.json_mode and g["scores"].get("json_valid"):
            exact = ok and p["obj"] == g["obj"]
        if rule.parts and g["parts"] is not None:
            right = {k: bool(p["parts"] is not None and p["parts"].get(k) == v) for k, v in g["parts"].items()}
            sc["parts"] = right
            sc["part_accuracy"] = ratio(sum(right.values()), len(right))
            for k, v in right.items():
                part_has[k] += 1
                part_right[k] += v
        cls = r.get("category")
        if rule.grammar:
            gp, pp = g["parsed"], p["parsed"]
            ref_items = Counter((n, it) for n, items in (gp["slots"] if gp else []) for it in items)
            pred_items = Counter((n, it) for n, items in (pp["slots"] if pp else []) for it in items)
            tp_c = ref_items & pred_items
            tp, fp, fn = (
                sum(tp_c.values()),
                sum((pred_items - ref_items).values()),
                sum((ref_items - pred_items).values()),
            )
            names: dict[str, list[int]] = {}
            for (nm, _), c in ref_items.items():
                names.setdefault(nm, [0, 0, 0])[2] += c
            for (nm, _), c in pred_items.items():
                names.setdefault(nm, [0, 0, 0])[1] += c
            for (nm, _), c in tp_c.items():
                names[nm][0] += c
                names[nm][1] -= c
                names[nm][2] -= c
            pred_names = Counter(nm for nm, _ in (pp["slots"] if pp else []))
            ref_names = {nm for nm, _ in (gp["slots"] if gp else [])}
            fn_ok = bool(pp and gp and pp["function"] == gp["function"])
            sc.update(
                ref_parsed=gp is not None,
                function_correct=fn_ok,
                tp=tp,
                fp=fp,
                fn=fn,
                slot_f1=example_f1(tp, fp, fn, valid=pp is not None),
                slot_names=names,
                duplicated_slots=sorted(k for k, c in pred_names.items() if c > 1),
                invented_slots=sorted(k for k in pred_names if gp is not None and k not in ref_names),
            )
            if gp is not None:
                exact = bool(ok and fn_ok and Counter(pp["slots"]) == Counter(gp["slots"]))
                cls = gp["function"]
                counts.update(fn_has=1, fn_ok=int(fn_ok))
            counts.update(tp=tp, fp=fp, fn=fn, dup=len(sc["duplicated_slots"]), inv=len(sc["invented_slots"]))
            for nm, (a, b, c) in names.items():
                slot_counts.setdefault(nm, Counter()).update(tp=a, fp=b, fn=c)
        sc["compliant"], sc["exact"], sc["error"] = bool(ok), bool(exact), p["error"]
        sc["class"] = None if cls is None else str(cls)
        for key in _RATES:
            if key in sc:
                counts[key] += bool(sc[key])
        counts.update(compliant=int(ok), exact=int(exact))
        r["correct"] = bool(exact)
        r["scores"] = sc
        if cls is not None:
            pc = per_class.setdefault(str(cls), Counter())
            pc.update(
                support=1,
                compliant=int(ok),
                exact=int(exact),
                tp=sc.get("tp", 0),
                fp=sc.get("fp", 0),
                fn=sc.get("fn", 0),
                p_right=sum((sc.get("parts") or {}).values()),
                p_has=len(sc.get("parts") or {}),
            )

    n = len(recs)
    metrics: dict[str, Any] = {
        "task": "format",
        "n": n,
        "checks": rule.checks,
        "rule": rule.describe(),
        "compliance_rate": counts["compliant"] / n,
        "exact_match": counts["exact"] / n,
    }
    for key, name in _RATES.items():
        if key in recs[0]["scores"]:
            metrics[name] = counts[key] / n
    if rule.parts:
        metrics["part_accuracy"] = ratio(sum(part_right.values()), sum(part_has.values()))
        metrics["per_field"] = {
            k: {"accuracy": ratio(part_right[k], part_has[k]), "support": part_has[k]}
            for k in rule.parts
            if part_has[k]
        }
    if rule.grammar:
        metrics.update(
            function_accuracy=ratio(counts["fn_ok"], counts["fn_has"]),
            slot_precision=ratio(counts["tp"], counts["tp"] + counts["fp"]),
            slot_recall=ratio(counts["tp"], counts["tp"] + counts["fn"]),
            slot_f1=f1(counts["tp"], counts["fp"], counts["fn"]),
            n_duplicated_slots=counts["dup"],
            n_invented_slots=counts["inv"],
        )
        metrics["per_field"] = {
            nm: {
                "precision": ratio(c["tp"], c["tp"] + c["fp"]),
                "recall": ratio(c["tp"], c["tp"] + c["fn"]),
                "f1": f1(c["tp"], c["fp"], c["fn"]),
                "support": c["tp"] + c["fn"],
            }
            for nm, c in sorted(slot_counts.items())
            if c["tp"] + c["fn"] > 0
        }
    out_pc = {}
    for c, pc in sorted(per_class.items()):
        entry = {
            "support": pc["support"],
            "compliance_rate": ratio(pc["compliant"], pc["support"]),
            "exact_match": ratio(pc["exact"], pc["support"]),
        }
        if rule.parts:
            entry["part_accuracy"] = ratio(pc["p_right"], pc["p_has"])
        if rule.grammar:
            entry["slot_f1"] = f1(pc["tp"], pc["fp"], pc["fn"])
        out_pc[c] = entry
    metrics["per_class"] = out_pc
    return recs, metrics


# --------------------------------------------------------------------------- bootstrap statistics
def _stats(
    recs: list[dict], classes: list[str], rate_keys: list[str], parts: list[str], slots: list[str], grammar: bool
) -> dict:
    sc = [r["scores"] for r in recs]
    member = onehot([s.get("class") for s in sc], classes)
    comp, exact = col([s["compliant"] for s in sc]), col([s["exact"] for s in sc])
    z = {"compliant": comp, "exact": exact, "c_member": member, "c_compliant": member * comp, "c_exact": member * exact}
    for key in rate_keys:
        z[key] = col([s[key] for s in sc])
    if parts:
        right = np.array([[float((s.get("parts") or {}).get(p, False)) for p in parts] for s in sc])
        has = multihot([list(s.get("parts") or {}) for s in sc], parts)
        z.update(
            p_right=right,
            p_has=has,
            c_pright=member * right.sum(axis=1, keepdims=True),
            c_phas=member * has.sum(axis=1, keepdims=True),
        )
    if grammar:
        tp, fp, fn = col([s["tp"] for s in sc]), col([s["fp"] for s in sc]), col([s["fn"] for s in sc])
        z.update(
            tp=tp,
            fp=fp,
            fn=fn,
            fn_ok=col([s["function_correct"] for s in sc]),
            fn_has=col([s["ref_parsed"] for s in sc]),
            c_tp=member * tp,
            c_fp=member * fp,
            c_fn=member * fn,
        )
        st, sf, sn = (np.zeros((len(recs), len(slots))) for _ in range(3))
        idx = {k: j for j, k in enumerate(slots)}
        for i, s in enumerate(sc):
            for nm, (a, b, c) in (s.get("slot_names") or {}).items():
                if nm in idx:
                    st[i, idx[nm]], sf[i, idx[nm]], sn[i, idx[nm]] = a, b, c
        z.update(s_tp=st, s_fp=sf, s_fn=sn)
    return z


def _metric_fn(classes, rate_keys, parts, slots, grammar):
    def fn(z: dict, n: int, undefined: float) -> dict:
        out: dict = {"compliance_rate": z["compliant"][:, 0] / n, "exact_match": z["exact"][:, 0] / n}
        for key in rate_keys:
            out[_RATES[key]] = z[key][:, 0] / n
        m = z["c_member"]
        comp, ex = div(z["c_compliant"], m, undefined), div(z["c_exact"], m, undefined)
        for j, c in enumerate(classes):
            out[("per_class", c, "compliance_rate")] = comp[:, j]
            out[("per_class", c, "exact_match")] = ex[:, j]
        if parts:
            out["part_accuracy"] = div(z["p_right"].sum(axis=1), z["p_has"].sum(axis=1), 0.0)
            acc = div(z["p_right"], z["p_has"], undefined)
            for j, p in enumerate(parts):
                out[("per_field", p, "accuracy")] = acc[:, j]
            cp = div(z["c_pright"], z["c_phas"], undefined)
            for j, c in enumerate(classes):
                out[("per_class", c, "part_accuracy")] = cp[:, j]
        if grammar:
            tp, fp, fneg = z["tp"][:, 0], z["fp"][:, 0], z["fn"][:, 0]
            out.update(
                function_accuracy=div(z["fn_ok"][:, 0], z["fn_has"][:, 0], 0.0),
                slot_precision=div(tp, tp + fp, 0.0),
                slot_recall=div(tp, tp + fneg, 0.0),
                slot_f1=div(2 * tp, 2 * tp + fp + fneg, 0.0),
            )
            st, sf, sn = z["s_tp"], z["s_fp"], z["s_fn"]
            per = {
                "precision": div(st, st + sf, undefined),
                "recall": div(st, st + sn, undefined),
                "f1": div(2 * st, 2 * st + sf + sn, undefined),
            }
            for j, s in enumerate(slots):
                for k, arr in per.items():
                    out[("per_field", s, k)] = arr[:, j]
            cf1 = div(2 * z["c_tp"], 2 * z["c_tp"] + z["c_fp"] + z["c_fn"], undefined)
            for j, c in enumerate(classes):
                out[("per_class", c, "slot_f1")] = cf1[:, j]
        return out

    return fn


# tests/tasks/test_task_matrix.py: an output without the required fields (hypothesis.required_fields) never passes a
# rule
_REQUIRED = " and has every required field (when hypothesis.required_fields is set)"
_RULES = {
    "compliance_rate": ("compliant", "an example passes when its output follows the format rule"),
    "exact_match": ("exact", "an example passes when its output equals the reference under the format rule"),
    "function_accuracy": (
        "function_correct",
        f"an example passes when its function name (dialogue act) is right{_REQUIRED}",
    ),
    **{
        name: (key, f"an example passes when its output passes the {key.replace('_', ' ')} check{_REQUIRED}")
        for key, name in _RATES.items()
        if key != "required_present"
    },
    "required_fields_rate": ("required_present", "an example passes when its output has every required field"),
}


def _gated(score, key: str = "required_present"):
    """``score(rec)``, and 0.0 for an example whose ``scores[key]`` is False: by default an output
    missing a required field (the key exists only when hypothesis.required_fields is set);
    ``key="compliant"`` for the F1-like rules, so an output that breaks the format rule never passes."""
    return lambda r: float(score(r)) if (r.get("scores") or {}).get(key, True) else 0.0


class Format(Task):
    name = "format"
    template = "format.yaml"
    reader = ReaderHints(
        label="data.fields.label (optional): a category for per-class metrics",
        target="data.fields.target: the expected output, which must follow the study's format rule",
        model_kinds=("causal-lm",),
    )
    headline = (
        "compliance_rate",
        "json_valid_rate",
        "schema_valid_rate",
        "regex_match_rate",
        "grammar_valid_rate",
        "required_fields_rate",
        "part_accuracy",
        "function_accuracy",
        "slot_f1",
        "exact_match",
    )
    per_class_metric = "compliance_rate"

    def metric_names(self, cfg: TaskConfig) -> dict[str, list[str]]:
        e = cfg.eval
        if (
            e.json_schema is None
            and e.regex is None
            and getattr(e, "grammar", None) is None
            and not cfg.required_fields
        ):
            return names(
                ["compliance_rate", "exact_match"], ["compliance_rate", "exact_match"], []
            )  # no rule yet: scoring says so
        rule = FormatRule.from_config(cfg)
        agg = ["compliance_rate", "exact_match"]
        agg += (["json_valid_rate"] if rule.json_mode else []) + (["schema_valid_rate"] if rule.validator else [])
        agg += (["regex_match_rate"] if rule.pattern else []) + (["part_accuracy"] if rule.parts else [])
        agg += (
            ["grammar_valid_rate", "function_accuracy", "slot_precision", "slot_recall", "slot_f1"]
            if rule.grammar
            else []
        )
        agg += ["required_fields_rate"] if rule.required else []
        per_class = (
            ["compliance_rate", "exact_match"]
            + (["part_accuracy"] if rule.parts else [])
            + (["slot_f1"] if rule.grammar else [])
        )
        per_field = ["accuracy"] if rule.parts else ["precision", "recall", "f1"] if rule.grammar else []
        return names(agg, per_class, per_field)

    def score(self, records, cfg: TaskConfig):
        e = cfg.eval
        return score_format(
            records,
            json_schema=e.json_schema,
            regex=e.regex,
            allow_fenced=e.allow_fenced_json,
            required_fields=cfg.required_fields,
            grammar=getattr(e, "grammar", None),
        )

    def bootstrap_stats(self, base, cand, base_m, cand_m, cfg) -> BootstrapStats:
        classes = sorted(base_m["per_class"])
        rate_keys = [k for k in _RATES if k in base[0]["scores"]]
        grammar = "slot_f1" in base_m
        parts = sorted(base_m.get("per_field", {})) if "part_accuracy" in base_m else []
        slots = sorted(set(base_m.get("per_field", {})) | set(cand_m.get("per_field", {}))) if grammar else []
        args = (classes, rate_keys, parts, slots, grammar)
        return BootstrapStats(
            _stats(base, *args), _stats(cand, *args), _metric_fn(*args), [r["scores"].get("class") for r in base]
        )

    def example_rule(self, metric: str | None) -> ExampleRule:
        """The per-example rule behind the paired counts of ``metric`` (exact match by default). An
        output missing a required field never passes; slot F1 and part accuracy pass only an output
        that follows the whole format rule (an unparseable output never does)."""
        if metric in _RULES:
            key, desc = _RULES[metric]
            return ExampleRule(key, desc, _gated(lambda r, k=key: bool(r["scores"].get(k))))
        if metric in ("slot_f1", "slot_precision", "slot_recall"):
            return ExampleRule(
                "slot_f1",
                f"an example passes when its output follows the format rule and its slot F1 is >= {PASS_F1:g}",
                _gated(lambda r: r["scores"].get("slot_f1", 0.0), "compliant"),
                PASS_F1,
            )
        if metric == "part_accuracy":
            return ExampleRule(
                "part_accuracy",
                f"an example passes when its output follows the format rule and at least {PASS_F1:.0%} of its "
                "named parts are right",
                _gated(lambda r: r["scores"].get("part_accuracy", 0.0), "compliant"),
                PASS_F1,
            )
        return ExampleRule("exact", _RULES["exact_match"][1], lambda r: float(bool(r["scores"].get("exact"))))

    def predicted_key(self, rec: dict) -> str | None:
        return None

    def failure_kind(self, rec: dict) -> str:
        sc = rec.get("scores") or {}
        if sc.get("parse_error"):
            return str(sc["parse_error"]).split(":", 1)[0].strip() or "not JSON"
        if sc.get("schema_valid") is False:
            return "JSON Schema violated"
        if sc.get("regex_match") is False:
            return "regular expression not matched"
        if sc.get("grammar_valid") is False:
            return "grammar not followed"
        if sc.get("required_present") is False:
            return "required fields missing"
        if sc.get("duplicated_slots"):
            return "duplicated slots"
        if sc.get("invented_slots"):
            return "invented slots"
        if sc.get("function_correct") is False:
            return "wrong function"
        return "output differs from the reference"

    def audit(self, splits, cfg: TaskConfig) -> dict[str, Any]:
        labels = audit_labels(splits, cfg.test_split)
        targets = audit_format_targets([e for v in splits.values() for e in v], FormatRule.from_config(cfg))
        return {
            "labels": labels,
            "targets": targets,
            "hard_faults": labels["hard_faults"] + targets["hard_faults"],
            "warnings": labels["warnings"] + targets["warnings"],
        }


TASK = Format()
