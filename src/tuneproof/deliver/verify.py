"""The fresh-process entry point of bundle verification: ``python -m tuneproof.deliver.verify BUNDLE
[--base PATH] [--device D] --out FILE`` runs :func:`~tuneproof.deliver.bundle_verification.verify_bundle`
and writes its report as JSON.

:func:`~tuneproof.deliver.bundle_verification.verify_in_fresh_process` starts this module, and every
exported bundle names it in ``procedure.tolerance`` (bundles exported before the checks moved to
:mod:`tuneproof.deliver.bundle_verification` too), so its path stays. The checks, their order and
the tolerances are documented in :mod:`tuneproof.deliver.bundle_verification`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from tuneproof import procs
from tuneproof.deliver.bundle_verification import DEVICE_ATOL, verify_bundle
from tuneproof.errors import TuneproofError
from tuneproof.io import write_json


def main(argv: list[str] | None = None) -> int:
    """``python -m tuneproof.deliver.verify BUNDLE [--base PATH] --out FILE``: writes the report
    (or ``{"error": {...}}``) as JSON and exits 0 whatever the verdict (the parent judges it)."""
    procs.die_with_parent()  # a killed export leaves no orphaned verify process
    p = argparse.ArgumentParser(prog="python -m tuneproof.deliver.verify")
    p.add_argument("bundle")
    p.add_argument("--base", default=None)
    p.add_argument("--device", default=None, choices=sorted(DEVICE_ATOL))
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        report = verify_bundle(a.bundle, a.base, a.device)
    except TuneproofError as err:
        report = {"error": {"message": err.message, "hint": err.hint, "exit_code": err.exit_code}}
    write_json(a.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
