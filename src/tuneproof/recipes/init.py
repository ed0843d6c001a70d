"""Recipe ``init``: write a study file from the template of a task kind."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tuneproof.errors import TuneproofError
from tuneproof.io import atomic_write_text
from tuneproof.recipes.schema import write_schema
from tuneproof.study import SCHEMA_FILE, STUDY_FILE
from tuneproof.tasks import TASKS, get_task


def template_text(task: str) -> str:
    """The commented study file template of a task kind (the kind's ``template`` part)."""
    if task not in TASKS:
        raise TuneproofError(f"unknown task kind '{task}'", hint=f"use one of: {', '.join(TASKS)}")
    return resources.files("tuneproof.templates").joinpath(TASKS[task].template).read_text(encoding="utf-8")


def run_init(directory: Path, task: str, *, force: bool = False) -> Path:
    """Create ``directory/tuneproof.yaml`` and, beside it, ``tuneproof.schema.json`` (the JSON Schema
    its first line names for editors). Raises :class:`TuneproofError` if the study file exists
    (unless ``force``), ``directory`` is a file or cannot be written."""
    text = template_text(task)
    folder = Path(directory)
    if folder.exists() and not folder.is_dir():
        named = folder.parent if folder.name == STUDY_FILE else "NEW_FOLDER"
        raise TuneproofError(
            f"{directory} is a file, not a folder: init writes {STUDY_FILE} into a study folder",
            hint=f"name the folder: tuneproof init {named}",
        )
    path = Path(directory) / STUDY_FILE
    if path.exists() and not force:
        raise TuneproofError(f"{path} already exists", hint="use --force to overwrite, or another folder")
    try:
        write_schema(Path(directory) / SCHEMA_FILE)
        return atomic_write_text(path, text)
    except OSError as err:
        raise TuneproofError(
            f"cannot write the study into {directory} ({err.strerror or type(err).__name__})",
            hint="name a folder in a place this user can write",
        ) from None


def reader_lines(task: str) -> list[str]:
    """What the task kind expects from the data (its ``reader`` part), for the init screen."""
    r = get_task(task).reader
    return [
        f"  {task}: label: {r.label}",
        f"  {task}: target: {r.target}",
        f"  {task}: model heads: {', '.join(r.model_kinds)}",
    ]
