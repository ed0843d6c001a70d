"""Errors a user can cause. The CLI prints them in one or two lines and exits with code 2."""

from __future__ import annotations


class TuneproofError(Exception):
    """A user-caused problem: says what was wrong, where (file, line, key) and what to do.

    The CLI catches it, prints ``str(err)`` without a traceback and exits with ``exit_code``.
    """

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message}\n  -> {hint}")

    def name_run(self, run_id: str) -> None:
        """Say which run this error ended (``... (run r0007)``), unless the message names it already."""
        if run_id in self.message:
            return
        self.message = f"{self.message} (run {run_id})"
        self.args = (self.message if self.hint is None else f"{self.message}\n  -> {self.hint}",)


class CheckFailed(TuneproofError):
    """A protocol check failed (data, preflight, guard): the command refuses to go on."""

    exit_code = 3


class Stopped(KeyboardInterrupt):
    """A train run stopped at a step boundary by a rule, not a signal (``stopped: rental reserve``):
    it saves a checkpoint, is recorded ``interrupted`` with this reason and can be resumed; the CLI
    exits 3 (a check stopped it)."""

    exit_code = 3


class Terminated(BaseException):
    """Raised inside a run by SIGTERM so that it is recorded as interrupted (the CLI exits 143)."""


def install_hint(extra: str) -> str:
    """How to add tuneproof's optional extra ``extra`` (pyproject.toml ``[project.optional-dependencies]``):
    tuneproof is installed from its clone (scripts/setup.sh), not from PyPI, so ``pip install 'tuneproof[X]'``
    would name a package that is not published."""
    return f"python -m pip install -e '.[{extra}]' in the tuneproof clone (tuneproof is not on PyPI)"
