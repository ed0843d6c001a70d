"""Environment snapshot and platform comparison (docs/PROTOCOL.md step 6)."""

import copy
import json

import numpy
import torch

from tuneproof.preflight.envinfo import compare_environments, environment_snapshot, package_version, platform_key


def _snap(**over):
    s = {
        "python": "3.11.7",
        "backend": "cuda",
        "torch": "2.5.1",
        "cuda": "12.4",
        "hip": None,
        "cudnn": 90100,
        "driver": "550.54",
        "cpu": {"model": "AMD EPYC"},
        "devices": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": [9, 0], "total_memory_bytes": 85 << 30}
        ],
        "libraries": {"transformers": "4.56.0", "peft": "0.17.0", "tokenizers": "0.21.0", "numpy": "2.1.0"},
    }
    s.update(over)
    return s


def test_snapshot_records_this_process_and_is_json_safe():
    s = environment_snapshot()
    json.dumps(s)
    assert s["torch"] == torch.__version__
    assert s["cuda"] == torch.version.cuda
    assert s["libraries"]["numpy"] == numpy.__version__
    assert s["libraries"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert s["cpu"]["logical_cores"] >= 1 and s["ram_bytes"] > 0
    assert s["backend"] == ("cpu" if not torch.cuda.is_available() else ("rocm" if torch.version.hip else "cuda"))
    assert set(s["libraries"]) >= {
        "transformers",
        "peft",
        "accelerate",
        "datasets",
        "safetensors",
        "tokenizers",
        "numpy",
        "scikit-learn",
        "datasketch",
        "bitsandbytes",
        "flash-attn",
        "deepspeed",
    }
    assert package_version("surely-not-an-installed-distribution-xyz") is None


def test_platform_key_names_backend_device_and_versions():
    key = platform_key(_snap())
    assert key == "cuda | 1x NVIDIA H100 80GB HBM3 (9.0) | torch 2.5.1 | cuda 12.4"
    cpu = platform_key(_snap(backend="cpu", devices=[], cuda=None, torch="2.5.1+cpu"))
    assert cpu == "cpu | AMD EPYC | torch 2.5.1+cpu"


def test_same_environment_passes():
    r = compare_environments(_snap(), _snap())
    assert r["passed"] and r["same_platform"] and r["changes"] == [] and r["redo"] == {}


def test_device_change_is_a_platform_change_redo_preflight_and_baseline():
    b = _snap(
        devices=[{"index": 0, "name": "AMD Instinct MI300X", "capability": [9, 4], "total_memory_bytes": 192 << 30}],
        backend="rocm",
        cuda=None,
        hip="6.2",
    )
    r = compare_environments(_snap(), b)
    assert not r["passed"] and not r["same_platform"]
    assert set(r["redo"]) == {"preflight", "baseline"}
    assert {c["field"] for c in r["changes"]} == {"backend", "devices", "cuda", "hip"}
    assert "platform changed" in r["message"] and "MI300X" in r["message"]


def test_library_change_is_named_with_the_checks_it_invalidates():
    b = copy.deepcopy(_snap())
    b["libraries"]["transformers"] = "4.57.0"
    b["libraries"]["peft"] = "0.18.0"
    r = compare_environments(_snap(), b)
    assert r["same_platform"] and not r["passed"]
    assert [c["field"] for c in r["changes"]] == ["libraries.peft", "libraries.transformers"]
    assert set(r["redo"]) == {"preflight", "data", "baseline"}
    assert r["redo"]["data"] == ["libraries.transformers: 4.56.0 -> 4.57.0"]
    assert "libraries.peft: 0.17.0 -> 0.18.0" in r["redo"]["preflight"]


def test_library_drift_names_each_differing_library_with_both_versions():
    from tuneproof.preflight.envinfo import library_drift

    train = {"libraries": {"torch": "2.5.0", "transformers": "4.57.1", "tokenizers": "0.22.1", "peft": "0.17.0"}}
    now = {"libraries": {"torch": "2.5.0", "transformers": "5.0.0", "tokenizers": None, "peft": "0.17.0"}}
    assert library_drift(train, now) == {
        "transformers": {"train": "4.57.1", "now": "5.0.0"},
        "tokenizers": {"train": "0.22.1", "now": None},
    }
    assert library_drift(train, train) == {}
    assert library_drift(None, now) == {} and library_drift({}, now) == {}  # runs recorded without versions
