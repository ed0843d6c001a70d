"""Recipe ``verify``: check an export bundle in a fresh process (docs/PROTOCOL.md step 4: the adapter
stays tied to the exact base model and version it was trained on).

Features (option that turns each on):
- every bundle file against its sha256 in the manifest (a missing or altered file is named);
- the base model (``--base PATH``, default the path recorded at export): sha256 of every weight
  file and the tokenizer's probe-text token ids against the manifest; a different base is refused
  naming both hashes (docs/CASES.md C13);
- the adapter loaded with ``PeftModel.from_pretrained`` (modules_to_save included, docs/CASES.md C6), the K
  stored examples predicted again and compared with the predictions recorded at export
  (identical; logits within 1e-4 on CPU, 1e-3 on CUDA for a bundle exported with ``--device
  cuda``); ``merged/`` checked the same way when present;
- ``--json FILE`` writes the full report.
The study folder is not needed: a bundle verifies on its own, on another machine too.
"""

from __future__ import annotations

from pathlib import Path

from tuneproof.deliver.bundle_verification import failure_message, verify_in_fresh_process
from tuneproof.errors import CheckFailed
from tuneproof.io import write_json
from tuneproof.ui import console, heartbeat, user_text

#: what to do after the first failed check: the bundle itself changed, or the base it is checked against
_BUNDLE_CHANGED = "the bundle was changed after export: do not use it; export the run again (tuneproof export RUN)"
_WRONG_BASE = "do not use this bundle with this base: pass the base it was exported from (--base PATH), or export again"
HINTS = {
    "manifest": _BUNDLE_CHANGED,
    "files": _BUNDLE_CHANGED,
    "claims": _BUNDLE_CHANGED,
    "base weights": _WRONG_BASE,
    "adapter config": _WRONG_BASE,
    "tokenizer": _WRONG_BASE,
    "image processor": _WRONG_BASE,
}


def failure_hint(report: dict) -> str:
    """The remedy for the first failed check of ``report``: an altered bundle (manifest, files,
    claims) is exported again; a base that differs (weights, adapter revision, tokenizer, image
    processor) is replaced with the one recorded; a reload or prediction failure, both."""
    bad = next((c["name"] for c in report["checks"] if not c["passed"]), None)
    return HINTS.get(
        bad, "do not use this bundle: export the run again, or pass the base it was exported from (--base PATH)"
    )


def run_verify(
    bundle: Path, base: Path | None = None, *, json_out: Path | None = None, device: str | None = None
) -> dict:
    """Verify ``bundle`` in a new process and print each check; returns the report.

    Raises:
        TuneproofError: no bundle or manifest there, or the base folder does not exist (exit 2).
        CheckFailed: a check failed (exit 3); the message names the file, hashes or examples.
    """
    with heartbeat("verify", "reloading the bundle and predicting its examples in a fresh process"):
        report = verify_in_fresh_process(bundle, base, device=device)
    if json_out is not None:
        write_json(json_out, report)
    for c in report["checks"]:
        mark = "[green]pass[/]" if c["passed"] else "[red]FAIL[/]"
        console.print(f"  {mark} {c['name']}: {user_text(c['detail'])}", soft_wrap=True)
        for p in c["problems"][:8]:
            console.print(f"       {user_text(p)}", soft_wrap=True)
    if not report["passed"]:
        raise CheckFailed(failure_message(report), hint=failure_hint(report))
    console.print(f"[bold green]verified[/] {user_text(bundle)} ({report['seconds']:.1f} s in a fresh process)")
    return report
