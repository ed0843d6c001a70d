"""Dtype choice per device (docs/CASES.md C9) and extension builds (docs/PROTOCOL.md step 6)."""

import json

import pytest
import torch

from tuneproof.errors import TuneproofError
from tuneproof.models.device import DeviceInfo, choose_dtype, detect_device
from tuneproof.preflight.backend import check_extensions, inspect_extension, scan_binary
from tuneproof.preflight.envinfo import package_version

T4 = DeviceInfo("cuda", "Tesla T4", (7, 5), bf16_supported=False)
V100 = DeviceInfo("cuda", "Tesla V100-SXM2-16GB", (7, 0), bf16_supported=True)  # emulation-inclusive flag must not win
A100 = DeviceInfo("cuda", "NVIDIA A100-SXM4-80GB", (8, 0), bf16_supported=True)
CPU = DeviceInfo("cpu", "AMD EPYC", None, bf16_supported=False)


@pytest.mark.parametrize("gpu", [T4, V100])
def test_c9_bf16_on_capability_7x_is_refused_with_the_reason(gpu):
    r = choose_dtype("bf16", gpu)
    json.dumps(r)
    assert r["passed"] is False and r["dtype"] is None
    cap = f"{gpu.capability[0]}.{gpu.capability[1]}"
    assert f"compute capability {cap} < 8.0" in r["reason"]
    assert "refused" in r["message"] and "'fp32'" in r["message"]
    assert r["device"]["capability"] == list(gpu.capability)


def test_c9_auto_on_capability_7x_falls_back_to_fp32_and_says_why():
    r = choose_dtype("auto", T4)
    assert r["passed"] and r["dtype"] == "fp32"
    assert "7.5 < 8.0" in r["reason"] and "fp32 chosen" in r["reason"]


def test_c9_capability_8_gives_bf16_for_bf16_and_auto():
    assert choose_dtype("bf16", A100)["dtype"] == "bf16"
    r = choose_dtype("auto", DeviceInfo("cuda", "NVIDIA H200", (9, 0), True))
    assert r["dtype"] == "bf16" and "9.0 >= 8.0" in r["reason"]


def test_fp16_on_cpu_refused_fp16_on_gpu_needs_scaler():
    r = choose_dtype("fp16", CPU)
    assert r["passed"] is False and r["dtype"] is None and "fp16 is not supported on CPU" in r["message"]
    g = choose_dtype("fp16", T4)
    assert g["passed"] and g["dtype"] == "fp16" and "GradScaler" in g["reason"]


def test_cpu_auto_is_fp32_and_bf16_is_allowed_but_marked_emulated():
    assert choose_dtype("auto", CPU)["dtype"] == "fp32"
    r = choose_dtype("bf16", CPU)
    assert r["passed"] and r["dtype"] == "bf16" and "emulated" in r["reason"]
    native = choose_dtype("bf16", DeviceInfo("cpu", "Xeon", None, True))
    assert "native" in native["reason"]
    assert choose_dtype("fp32", T4)["dtype"] == "fp32"


def test_rocm_uses_the_architecture():
    mi250 = DeviceInfo("rocm", "AMD Instinct MI250X", (9, 0), False, "gfx90a:sramecc+:xnack-")
    mi50 = DeviceInfo("rocm", "AMD Instinct MI50", (9, 0), False, "gfx906:sramecc+:xnack-")
    assert choose_dtype("auto", mi250)["dtype"] == "bf16"
    r = choose_dtype("bf16", mi50)
    assert r["passed"] is False and "gfx906" in r["reason"]
    assert choose_dtype("auto", mi50)["dtype"] == "fp32"


def test_unknown_precision_is_a_user_error():
    with pytest.raises(TuneproofError, match="unknown precision 'bf32'"):
        choose_dtype("bf32", CPU)


def test_detect_device_matches_torch():
    d = detect_device()
    if torch.cuda.is_available():
        assert d.type in ("cuda", "rocm") and d.capability is not None
    else:
        assert d.type == "cpu" and d.capability is None and d.name


def _fake(table):
    return lambda name: {"name": name, "evidence": [], **table[name]}


def test_extensions_missing_and_built_for_the_other_backend():
    table = {
        "flash-attn": {"installed": False, "version": None, "built_for": []},
        "bitsandbytes": {"installed": True, "version": "0.45.0", "built_for": ["cuda"]},
        "deepspeed": {"installed": True, "version": "0.16.0", "built_for": ["rocm"]},
    }
    mi300 = DeviceInfo("rocm", "AMD Instinct MI300X", (9, 4), True, "gfx942")
    r = check_extensions(mi300, ["flash_attn", "bitsandbytes", "deepspeed"], inspect=_fake(table))
    json.dumps(r)
    assert r["passed"] is False
    ext = r["extensions"]
    assert ext["flash-attn"]["passed"] is False and "not installed" in ext["flash-attn"]["message"]
    assert ext["bitsandbytes"]["passed"] is False
    assert "built for CUDA but the device is ROCM" in ext["bitsandbytes"]["message"]
    assert ext["deepspeed"]["passed"] is True
    ok = check_extensions(A100, ["bitsandbytes"], inspect=_fake(table))
    assert ok["passed"] and ok["extensions"]["bitsandbytes"]["message"] == "bitsandbytes 0.45.0 ok (built for cuda)"


def test_flash_attn_on_cpu_fails_and_unknown_extension_is_an_error():
    table = {"flash-attn": {"installed": True, "version": "2.7.0", "built_for": ["cuda"]}}
    r = check_extensions(CPU, ["flash-attn"], inspect=_fake(table))
    assert r["passed"] is False and "needs a CUDA or ROCm GPU" in r["message"]
    with pytest.raises(TuneproofError, match="unknown extension 'apex'"):
        check_extensions(CPU, ["apex"])


def test_real_inspection_and_binary_scan(tmp_path):
    for name in ("flash-attn", "bitsandbytes", "deepspeed"):
        assert inspect_extension(name)["installed"] == (package_version(name) is not None)
    lib = tmp_path / "ext.so"
    lib.write_bytes(b"\x7fELF" + b"\0" * 64 + b"libamdhip64.so.6\0libc10_hip.so\0")
    assert scan_binary(lib) == {"rocm"}
    lib.write_bytes(b"\x7fELF" + b"\0" * 64 + b"libcudart.so.12\0")
    assert scan_binary(lib) == {"cuda"}
