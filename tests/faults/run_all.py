"""Run the fault-injection suite (docs/CASES.md, faults of the machine and of the input) and print tried / survived per
kind of fault.

    python -m tests.faults.run_all            # the fast set (what CI runs as part of pytest)
    python -m tests.faults.run_all --full     # + the full set: real tmpfs disk-full and read-only
                                              #   mounts (root), kill -9 / SIGTERM at many moments

Every test in tests/ marked ``@pytest.mark.fault("kind: what")`` is one injected fault, and so is
every test of the modules in :data:`OTHER_MODULES` (the integrity and data-file faults,
tested where their code lives); a test "survived" when it passed, i.e. the outcome it asserts
(exit code, message, run status, files left) held. Skipped tests (a full-set test without --full,
a root-only mount) are not tried.
Extra arguments go to pytest (e.g. ``-k registry``). Exit code 0 when every tried fault survived.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: test modules elsewhere that cover faults of the machine and of the input -> the kind they are counted under
OTHER_MODULES = {
    "tests/test_no_code_loading.py": "integrity: loading runs no code",
    "tests/training/test_checkpoint_integrity.py": "integrity: checkpoint hashes, planted pickle, --fallback",
    "tests/training/test_base_integrity.py": "integrity: base model hashes",
    "tests/deliver/test_deliver_claims.py": "integrity: outputs and bundle claims",
    "tests/data/test_inputs.py": "input: data files (tests/data/test_inputs.py)",
}


class Tally:
    """A pytest plugin: the fault kind of every collected test and its outcome."""

    def __init__(self) -> None:
        self.kind: dict[str, str] = {}
        self.outcome: dict[str, str] = {}

    def pytest_collection_modifyitems(self, config, items):
        kept, dropped = [], []
        for item in items:
            m = item.get_closest_marker("fault")
            module = item.nodeid.split("::")[0]
            if m is not None:
                self.kind[item.nodeid] = m.args[0] if m.args else "unnamed"
            elif module in OTHER_MODULES:
                self.kind[item.nodeid] = OTHER_MODULES[module]
            (kept if item.nodeid in self.kind else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def pytest_runtest_logreport(self, report):
        if report.nodeid not in self.kind:
            return
        if report.failed:
            self.outcome[report.nodeid] = "failed"
        elif report.skipped:
            self.outcome.setdefault(report.nodeid, "skipped")
        elif report.when == "call":
            self.outcome.setdefault(report.nodeid, "passed")

    def table(self) -> tuple[str, int, int]:
        per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for node, kind in self.kind.items():
            out = self.outcome.get(node, "skipped")
            if out == "skipped":
                per[kind][2] += 1
                continue
            per[kind][0] += 1
            per[kind][1] += out == "passed"
        width = max([len(k) for k in per] + [10])
        lines = [f"{'kind of fault':<{width}}  tried  survived  not tried"]
        for kind in sorted(per):
            t, s, n = per[kind]
            lines.append(f"{kind:<{width}}  {t:>5}  {s:>8}  {n:>9}")
        tried = sum(v[0] for v in per.values())
        survived = sum(v[1] for v in per.values())
        lines.append(f"{'total':<{width}}  {tried:>5}  {survived:>8}  {sum(v[2] for v in per.values()):>9}")
        return "\n".join(lines), tried, survived


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--full" in argv:
        argv.remove("--full")
        os.environ["TUNEPROOF_FAULTS_FULL"] = "1"
    tally = Tally()
    os.chdir(ROOT)  # node ids relative to the repository (OTHER_MODULES)
    code = pytest.main(["-q", "-p", "no:cacheprovider", "tests", *argv], plugins=[tally])
    text, tried, survived = tally.table()
    full = os.environ.get("TUNEPROOF_FAULTS_FULL") == "1"
    print(f"\nfault-injection suite ({'full' if full else 'fast'} set): tried {tried}, survived {survived}")
    print(text)
    return 0 if code == 0 and tried == survived else 1


if __name__ == "__main__":
    sys.exit(main())
