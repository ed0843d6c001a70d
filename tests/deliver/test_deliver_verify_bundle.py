"""``tuneproof verify``: a missing or altered bundle file is named, a base with different weights is
refused naming both hashes (docs/CASES.md C13), a missing base is a user error (exit 2)."""

from __future__ import annotations

import shutil

import pytest

from tuneproof.cli import main
from tuneproof.deliver.bundle_verification import verify_bundle, verify_in_fresh_process
from tuneproof.errors import CheckFailed, TuneproofError
from tuneproof.io import read_json, sha256_file
from tuneproof.models.identity import combined_weights_hash


def _exit_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as e:
        main(argv)
    return e.value.code


@pytest.fixture()
def bundle_copy(cls_bundle, tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(cls_bundle["bundle"], dest)
    return dest


def test_altered_file_is_named_with_both_hashes(bundle_copy, capsys):
    target = bundle_copy / "adapter" / "adapter_model.safetensors"
    expected = sha256_file(target)
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01  # one bit of one tensor
    target.write_bytes(bytes(data))
    found = sha256_file(target)
    report = verify_in_fresh_process(bundle_copy)
    assert report["passed"] is False
    assert [c["name"] for c in report["checks"]] == ["manifest", "files"]  # nothing was loaded
    files = report["checks"][1]
    assert files["name"] == "files" and not files["passed"]
    assert files["problems"] == [
        f"altered file: adapter/adapter_model.safetensors (expected sha256 {expected}, found {found})"
    ]
    assert _exit_code(["verify", str(bundle_copy)]) == 3
    out, err = capsys.readouterr()
    assert "adapter/adapter_model.safetensors" in out and expected in out.replace("\n", "")
    # the remedy is to export again, not another --base: the bundle itself changed
    said = " ".join((out + err).split())
    assert "-> the bundle was changed after export: do not use it; export the run again (tuneproof export RUN)" in said
    assert "pass the right --base" not in said


def test_missing_file_is_named(bundle_copy):
    (bundle_copy / "verify" / "examples.jsonl").unlink()
    (bundle_copy / "notes.txt").write_text("added by hand\n")
    report = verify_bundle(bundle_copy)
    files = report["checks"][1]
    assert not report["passed"]
    assert files["problems"] == ["missing file: verify/examples.jsonl", "extra file not in the manifest: notes.txt"]
    assert "1 extra file(s) not in the manifest: notes.txt" in files["detail"]
    with pytest.raises(CheckFailed, match="missing file: verify/examples.jsonl"):
        from tuneproof.recipes.verify import run_verify

        run_verify(bundle_copy)


@pytest.mark.fault("tampering: a file added to a bundle")
def test_an_extra_file_alone_fails_the_bundle_and_is_named(bundle_copy, capsys):
    """Issue 33 item 17: a bundle with one file added (a tokenizer file the loader may pick up)
    and nothing else changed passed verify without naming it."""
    (bundle_copy / "adapter" / "special_tokens_map.json").write_text("{}")
    report = verify_bundle(bundle_copy)
    files = report["checks"][1]
    assert report["passed"] is False and [c["name"] for c in report["checks"]] == ["manifest", "files"]
    assert files["problems"] == ["extra file not in the manifest: adapter/special_tokens_map.json"]
    assert _exit_code(["verify", str(bundle_copy)]) == 3
    assert "extra file not in the manifest: adapter/special_tokens_map.json" in " ".join(
        capsys.readouterr().out.split()
    )


def test_c13_base_with_different_weights_is_refused_naming_both_hashes(cls_bundle, tmp_path):
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other-base"
    shutil.copytree(cls_bundle["base"], other)
    tensors = load_file(str(other / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3  # same architecture and shapes, other weights (another revision)
    save_file(tensors, str(other / "model.safetensors"), metadata={"format": "pt"})
    man = read_json(cls_bundle["bundle"] / "manifest.json")
    expected = man["base_model"]["weight_files"]["model.safetensors"]
    found = sha256_file(other / "model.safetensors")
    assert expected != found
    report = verify_in_fresh_process(cls_bundle["bundle"], base=other)
    check = report["checks"][-1]
    assert not report["passed"] and check["name"] == "base weights" and not check["passed"]
    assert check["problems"][0] == f"weight file model.safetensors: expected sha256 {expected}, found {found}"
    assert check["problems"][1] == (
        f"combined weights hash: expected {man['base_model']['weights_sha256']}, "
        f"found {combined_weights_hash({'model.safetensors': found})}"
    )
    assert "examples" not in report or report["examples"] == []  # refused before loading the adapter
    from tuneproof.recipes.verify import failure_hint

    assert failure_hint(report).startswith(
        "do not use this bundle with this base: pass the base it was exported from (--base PATH)"
    )
    assert _exit_code(["verify", str(cls_bundle["bundle"]), "--base", str(other)]) == 3


def test_base_with_another_tokenizer_is_refused(cls_bundle, tmp_path):
    other = tmp_path / "other-tok"
    shutil.copytree(cls_bundle["base"], other)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["zzzextra"])
    tok.save_pretrained(other)
    report = verify_bundle(cls_bundle["bundle"], base=other)
    check = report["checks"][-1]
    assert check["name"] == "tokenizer" and not check["passed"]
    assert "tokenizer vocab_size: expected 41, found 42" in check["problems"]


def test_missing_base_or_bundle_is_a_user_error(cls_bundle, tmp_path):
    with pytest.raises(TuneproofError, match="base model not found at"):
        verify_in_fresh_process(cls_bundle["bundle"], base=tmp_path / "nowhere")
    assert _exit_code(["verify", str(tmp_path / "no-bundle")]) == 2


def test_verification_uses_the_recorded_device(cls_bundle):
    man = read_json(cls_bundle["bundle"] / "manifest.json")
    assert man["procedure"]["device"] == "cpu" and man["procedure"]["tolerance"].startswith(
        "predictions identical; logits within 0.0001"
    )
    with pytest.raises(TuneproofError, match="were made on cpu; verification compares on the same device"):
        verify_bundle(cls_bundle["bundle"], device="cuda")


@pytest.mark.fault("tampering: adapter tensor names under another module prefix")
def test_adapter_tensor_names_under_another_prefix_fail_the_reload_naming_the_keys(bundle_copy, capsys):
    # the adapter's tensors renamed, the manifest re-sealed: files and claims pass, the reload must not
    import json

    from safetensors.torch import load_file, save_file

    from tuneproof.deliver.bundle import MANIFEST, write_manifest_sha

    path = bundle_copy / "adapter" / "adapter_model.safetensors"
    tensors = load_file(str(path))
    save_file({k.replace("base_model.model.", "base_model.model.other."): v for k, v in tensors.items()}, str(path))
    man = read_json(bundle_copy / MANIFEST)
    man["files"]["adapter/adapter_model.safetensors"] = sha256_file(path)
    (bundle_copy / MANIFEST).write_text(json.dumps(man, indent=2))
    write_manifest_sha(bundle_copy)
    report = verify_bundle(bundle_copy)
    reload = report["checks"][-1]
    assert [c["name"] for c in report["checks"] if c["passed"]][-1] == "tokenizer"
    assert reload["name"] == "reload" and not reload["passed"] and not report["passed"]
    # the classifier head is saved whole (modules_to_save): PEFT looks it up first, by name
    assert reload["detail"] == (
        f"CheckFailed: the adapter {bundle_copy / 'adapter'} does not match the model: the tensor "
        f"base_model.model.classifier.weight is not in the file (its {len(tensors)} tensors: "
        "base_model.model.other.bert.encoder.layer.0.attention.self.query.lora_A.weight, "
        "base_model.model.other.bert.encoder.layer.0.attention.self.query.lora_B.weight ...)"
    )
    assert _exit_code(["verify", str(bundle_copy)]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert "reload: pass" not in out and "predictions identical" not in out


@pytest.mark.fault("input: base copy without its tokenizer files")
def test_a_base_copy_without_tokenizer_files_fails_the_tokenizer_check_in_one_line(cls_bundle, tmp_path, capsys):
    other = tmp_path / "no-tokenizer"
    shutil.copytree(cls_bundle["base"], other)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        (other / name).unlink(missing_ok=True)
    report = verify_bundle(cls_bundle["bundle"], base=other)
    check = report["checks"][-1]
    assert check["name"] == "tokenizer" and not check["passed"] and not report["passed"]
    assert check["detail"].startswith(
        f"tokenizer class: expected 'BertTokenizer', found none: tokenizer of {other}: none found (no tokenizer file: "
        "tokenizer.json, tokenizer_config.json, vocab.txt, ...)"
    )
    assert _exit_code(["verify", str(cls_bundle["bundle"]), "--base", str(other)]) == 3
    out = capsys.readouterr().out
    assert "Traceback" not in out and "ValueError" not in out.split("none found")[0]
