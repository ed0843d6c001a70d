"""Which config changes invalidate a passed preflight (docs/PROTOCOL.md step 5): exact keys."""

from tuneproof.preflight.scope import describe_changes, is_exempt, preflight_changes


def test_exempt_keys_keep_a_preflight_and_the_others_are_named():
    before = {
        "name": "a",
        "hypothesis": {"success": {"min_gain": 0.0}},
        "training": {
            "max_steps": 8,
            "epochs": None,
            "checkpoint_every": 2,
            "eval_every": None,
            "learning_rate": 0.01,
            "micro_batch_size": 4,
        },
        "eval": {
            "max_examples": None,
            "bootstrap_iterations": 100,
            "seed": 0,
            "regex": None,
            "batch_size": 4,
            "max_new_tokens": 8,
            "prompt": {"template": "{text}"},
        },
        "method": {"r": 4},
    }
    keep = {
        **before,
        "name": "b",
        "hypothesis": {"success": {"min_gain": 0.05}},
        "training": {**before["training"], "max_steps": None, "epochs": 2, "checkpoint_every": 5, "eval_every": 10},
        "eval": {**before["eval"], "max_examples": 50, "bootstrap_iterations": 2000, "seed": 3, "regex": "x"},
    }
    assert preflight_changes(before, keep) == []
    change = {
        **keep,
        "training": {**keep["training"], "micro_batch_size": 8},
        "eval": {**keep["eval"], "batch_size": 1, "max_new_tokens": 16, "prompt": {"template": "Q: {text}"}},
        "method": {"r": 8, "alpha": 32},
    }
    got = preflight_changes(before, change)
    assert [c["key"] for c in got] == [
        "eval.batch_size",
        "eval.max_new_tokens",
        "eval.prompt.template",
        "method.alpha",
        "method.r",
        "training.micro_batch_size",
    ]
    assert got[3] == {"key": "method.alpha", "from": None, "to": 32}
    assert describe_changes(got, limit=2) == "eval.batch_size: 4 -> 1, eval.max_new_tokens: 8 -> 16 and 4 more"
    assert is_exempt("training.max_steps") and is_exempt("hypothesis.guards") and not is_exempt("training.max_length")
    assert not is_exempt("training.max_steps_extra")  # a dotted component, not a string prefix


def test_a_key_added_by_a_later_version_keeps_the_preflight_at_its_default_only():
    """A preflight recorded before ``method.bnb_4bit_*`` and ``training.packing_length`` existed: the
    keys absent there and at their defaults now describe the same configuration; a non-default
    value, or a key present on both sides that changed, still invalidates."""
    before = {"method": {"kind": "lora", "r": 4}, "training": {"packing": False, "micro_batch_size": 4}}
    now = {
        "method": {
            "kind": "lora",
            "r": 4,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_quant_storage": "uint8",
        },
        "training": {"packing": False, "packing_length": None, "micro_batch_size": 4},
    }
    assert preflight_changes(before, now) == []
    other = {**now, "training": {**now["training"], "packing_length": 512}}
    assert preflight_changes(before, other) == [{"key": "training.packing_length", "from": None, "to": 512}]
    dropped = {"method": {"kind": "lora"}, "training": now["training"]}  # a key the current config lacks is a change
    assert preflight_changes(before, dropped) == [{"key": "method.r", "from": 4, "to": None}]


def test_adding_a_tracker_keeps_a_passed_preflight():
    """``tracking``/``report_to`` say where copies of the runs go; a training step is the same."""
    before = {"report_to": [], "tracking": {"mlflow": None}, "training": {"micro_batch_size": 4}}
    after = {
        "report_to": ["mlflow"],
        "tracking": {"mlflow": {"uri": "sqlite:///mlflow.db", "experiment": "x"}},
        "training": {"micro_batch_size": 4},
    }
    assert preflight_changes(before, after) == []
    assert is_exempt("report_to") and is_exempt("tracking.mlflow.uri") and not is_exempt("tracking_extra")
    assert [c["key"] for c in preflight_changes(before, {**after, "training": {"micro_batch_size": 8}})] == [
        "training.micro_batch_size"
    ]


def test_the_scoring_keys_keep_a_preflight_alike_and_the_decoding_keys_do_not():
    """The scope follows each key's role (tuneproof.study.ROLES): eval.grammar invalidated a preflight while
    eval.regex, the other format rule, did not."""
    before = {"eval": {"regex": None, "grammar": None, "do_sample": False}, "distributed": {"timeout_s": 600.0}}
    scoring = {"eval": {"regex": "a+", "grammar": "function_slots", "do_sample": False}}
    assert preflight_changes(before, {**before, **scoring}) == []
    assert preflight_changes(before, {**before, "distributed": {"timeout_s": 60.0}}) == []
    decoding = {"eval": {"regex": None, "grammar": None, "do_sample": True}}
    assert preflight_changes(before, {**before, **decoding}) == [{"key": "eval.do_sample", "from": False, "to": True}]
