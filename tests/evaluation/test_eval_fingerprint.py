"""Evaluation fingerprint: one hash per part, so a mismatch names what changed."""

import hashlib
import json
import sys
from pathlib import Path

try:
    import tuneproof  # noqa: F401
except ImportError:  # running from a checkout without an installed package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import pytest

from tuneproof.errors import TuneproofError
from tuneproof.evaluation.fingerprint import PARTS, diff_fingerprints, eval_fingerprint
from tuneproof.study import Eval

TOK = {"name_or_path": "smollm2-135m-instruct", "revision": "abc123", "vocab_sha256": "00" * 32}


def _fp(ids=("b", "a", "c"), task="extraction", required=("intent", "slots"), tok=TOK, **eval_kw):
    return eval_fingerprint(list(ids), Eval(**eval_kw), task, list(required), dict(tok))


def test_fingerprint_shape_and_values():
    fp = _fp()
    assert set(fp) == {"hash", "parts"} and tuple(fp["parts"]) == PARTS
    assert len(fp["hash"]) == 64 and int(fp["hash"], 16) >= 0
    canon = json.dumps(["a", "b", "c"], sort_keys=True, separators=(",", ":")).encode()
    assert fp["parts"]["eval_ids"] == hashlib.sha256(canon).hexdigest()
    combined = "".join(f"{p}={fp['parts'][p]}\n" for p in PARTS)
    assert fp["hash"] == hashlib.sha256(combined.encode()).hexdigest()


def test_same_procedure_same_hash_regardless_of_id_order():
    a, b = _fp(ids=("c", "a", "b")), _fp(ids=("a", "b", "c"))
    assert a == b and diff_fingerprints(a, b) == []
    assert eval_fingerprint(["a"], Eval().model_dump(), "extraction", ["intent", "slots"], TOK) == eval_fingerprint(
        ["a"], Eval(), "extraction", ["intent", "slots"], TOK
    )


@pytest.mark.parametrize(
    "change, part",
    [
        (dict(ids=("a", "b")), "eval_ids"),
        (dict(prompt={"template": "Extract: {text}"}), "prompt"),
        (dict(prompt={"system": "You are terse."}), "prompt"),
        (dict(max_new_tokens=32), "decoding"),
        (dict(do_sample=True), "decoding"),
        (dict(temperature=0.7), "decoding"),
        (dict(allow_fenced_json=True), "metrics"),
        (dict(regex=r"\{.*\}"), "metrics"),
        (dict(json_schema={"type": "object"}), "metrics"),
        (dict(required=("intent",)), "metrics"),
        (dict(task="format"), "metrics"),
        (dict(tok={**TOK, "revision": "def456"}), "tokenizer"),
    ],
)
def test_each_change_names_its_part(change, part):
    base, changed = _fp(), _fp(**change)
    assert diff_fingerprints(base, changed) == [part]
    assert base["hash"] != changed["hash"]


def test_settings_outside_the_procedure_do_not_change_it():
    assert _fp() == _fp(batch_size=4, bootstrap_iterations=2000, seed=9)


def test_duplicate_ids_refused_and_missing_parts_reported():
    with pytest.raises(TuneproofError, match=r"duplicate example ids: \['a'\]"):
        _fp(ids=("a", "b", "a"))
    a = _fp()
    b = {"hash": a["hash"], "parts": {k: v for k, v in a["parts"].items() if k != "tokenizer"}}
    assert diff_fingerprints(a, b) == ["tokenizer"]


#: a value away from the default for each ``eval`` key a fingerprint part takes from its role
OTHER_VALUE = {
    "max_new_tokens": 7,
    "do_sample": True,
    "temperature": 0.5,
    "allow_fenced_json": True,
    "json_schema": {"type": "object"},
    "regex": "a+",
    "grammar": "function_slots",
    "answer_from": "raw",
}


def test_every_decoding_and_scoring_key_is_in_its_part():
    """A new ``decodes`` or ``scores`` key of ``eval`` (tuneproof.study) joins the fingerprint by its role: left
    out of OTHER_VALUE here, this test fails until it is given a value that must change its part."""
    from tuneproof.evaluation.fingerprint import ELSEWHERE
    from tuneproof.study import keys_with_role

    for role, part in (("decodes", "decoding"), ("scores", "metrics")):
        keys = [k for k in keys_with_role(role, "eval") if k not in ELSEWHERE]
        assert keys and set(keys) <= set(OTHER_VALUE), (role, keys)
        for key in keys:
            assert diff_fingerprints(_fp(), _fp(**{key: OTHER_VALUE[key]})) == [part], key
    # the split through the evaluated ids; the batch size only where it can change the outputs (sampling)
    # eval.sets through each set's content (name, sha256, bytes, n, references) in its own part
    assert set(ELSEWHERE) == {"split", "batch_size", "sets"}
    assert diff_fingerprints(_fp(do_sample=True), _fp(do_sample=True, batch_size=3)) == ["decoding"]


def test_eval_sets_have_their_own_part_and_no_sets_keep_the_hash():
    """eval.sets (docs/eval-sets.md): each set's content is the ``eval_sets`` part; another version of a set (its
    sha256, its size) changes that part alone; no sets leave the fingerprint as before."""
    one = {"name": "general", "sha256": "a" * 64, "bytes": 120, "n": 10, "references": False}
    ids, tok = ["a", "b"], dict(TOK)
    plain = eval_fingerprint(ids, Eval(), "extraction", [], tok)
    assert eval_fingerprint(ids, Eval(), "extraction", [], tok, eval_sets=[]) == plain
    with_set = eval_fingerprint(ids, Eval(), "extraction", [], tok, eval_sets=[one])
    assert tuple(with_set["parts"]) == (*PARTS, "eval_sets")
    assert diff_fingerprints(plain, with_set) == ["eval_sets"]
    for change in ({"sha256": "b" * 64}, {"bytes": 121}):
        other = eval_fingerprint(ids, Eval(), "extraction", [], tok, eval_sets=[{**one, **change}])
        assert diff_fingerprints(with_set, other) == ["eval_sets"], change
