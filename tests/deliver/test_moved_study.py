"""A study folder copied (``cp -r``) or moved to another disk: the dossier, the bundle check and the
rental deliver read the copy's own export bundle, never the original folder's; an export record written
with an absolute path by an older version is mapped onto the copy, or named in one warning when the copy
has no such bundle (tuneproof.registry.read_recorded_path)."""

from __future__ import annotations

import json
import shutil

from tuneproof.context import StudyContext
from tuneproof.errors import CheckFailed
from tuneproof.recipes.report import run_report
from tuneproof.recipes.verify import run_verify
from tuneproof.registry import RELATIVE_PATHS, Registry


def _first_screen(study) -> str:
    ctx = StudyContext.open(study)
    try:
        run_report(ctx)
    except CheckFailed:  # this tiny study's dossier is INCOMPLETE (no test read...), still written
        pass
    finally:
        ctx.registry.close()
    return (study / "dossier.md").read_text()


def _copy_then_remove_original(src, tmp_path):
    a = tmp_path / "a" / "study"
    shutil.copytree(src, a)
    b = tmp_path / "b" / "study2"
    shutil.copytree(a, b)
    return a, b


def test_the_copy_names_and_verifies_its_own_bundle(cls_bundle, tmp_path):
    train, export = cls_bundle["ids"]["train"], cls_bundle["export"]
    assert Registry(cls_bundle["dir"]).get(export).summary["bundle"] == f"exports/{train}"  # recorded relative
    a, b = _copy_then_remove_original(cls_bundle["dir"], tmp_path)
    shutil.rmtree(a)
    md = _first_screen(b)
    assert f"export: exports/{train} (verified in a fresh process)" in md
    assert f"study folder: copied or moved from {cls_bundle['dir'].resolve()}; the paths its runs recorded" in md
    assert str(a) not in md
    row = next(line for line in md.splitlines() if line.startswith(f"| {export} | {train} |"))
    assert f"| exports/{train} |" in row
    reg = Registry(b)
    bundle = reg.recorded_path(reg.get(export).summary["bundle"]).path
    assert bundle == b / "exports" / train
    assert run_verify(bundle)["bundle"] == str(b / "exports" / train)


def test_an_old_absolute_bundle_record_is_mapped_onto_the_copy_or_named(cls_bundle, tmp_path):
    train, export = cls_bundle["ids"]["train"], cls_bundle["export"]
    a = tmp_path / "a" / "study"
    shutil.copytree(cls_bundle["dir"], a)
    reg = Registry(a)  # the record as an older version wrote it: the absolute bundle folder
    summary = {**reg.get(export).summary, "bundle": str(a / "exports" / train)}
    assert summary.pop(RELATIVE_PATHS) is True
    reg._update(export, summary=json.dumps(summary))
    reg.close()
    b = tmp_path / "b" / "study2"
    shutil.copytree(a, b)
    a.rename(a.with_name("gone"))  # moved away: the copy still reads its own bundle
    md = _first_screen(b)
    assert f"export: exports/{train} (verified in a fresh process)" in md and str(a) not in md

    shutil.rmtree(b / "exports" / train)  # the copy has no bundle: said, never a pointer to the other folder
    md = _first_screen(b)
    warning = (
        f"{a / 'exports' / train} was recorded in {a}, which is gone (this study was copied or moved from there); "
        f"this study folder has no exports/{train}"
    )
    assert f"export: {warning}: export it again here (`tuneproof export {train}`)" in md
    row = next(line for line in md.splitlines() if line.startswith(f"| {export} | {train} |"))
    assert f"| exports/{train} (not in this folder: {warning}) |" in row


def test_rental_deliver_in_the_copy_verifies_the_bundle_it_exported_there(cls_bundle, tmp_path, monkeypatch):
    """The export (replaced here: tests/deliver/test_rental.py runs the real one) records ``exports/RUN``;
    deliver verifies the copy's folder, wherever the command runs from."""
    import tuneproof.recipes.rental as rental_recipe
    from tuneproof import clock
    from tuneproof.cli import main

    train = cls_bundle["ids"]["train"]
    a, b = _copy_then_remove_original(cls_bundle["dir"], tmp_path)
    shutil.rmtree(b / "exports" / train)  # nothing to keep: deliver exports again, in the copy

    def export(ctx, run):
        with ctx.registry.run("export", parent=run) as r:
            (ctx.study_dir / "exports" / run).mkdir(parents=True)
            r.update_summary(bundle=f"exports/{run}", verified=True, **{RELATIVE_PATHS: True})
        return r.id

    verified = []
    monkeypatch.setattr(rental_recipe, "run_export", export)
    monkeypatch.setattr(rental_recipe, "run_verify", lambda p: verified.append(p) or {"passed": True, "seconds": 1.0})
    monkeypatch.setattr(rental_recipe, "run_report", lambda ctx, html=False: ctx.study_dir / "dossier.md")
    monkeypatch.chdir(tmp_path)
    with clock.use(lambda: 1_900_000_000.0):
        for args in (["rental", "start", "--days", "3"], ["rental", "deliver", "--run", train]):
            try:
                main([*args, "--study", str(b)])
            except SystemExit as e:
                assert e.code == 0
    assert verified == [b.resolve() / "exports" / train]
    assert json.loads((b / "rental.json").read_text())["delivered"]["bundle"] == f"exports/{train}"
