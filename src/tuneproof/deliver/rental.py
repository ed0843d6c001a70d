"""The rental window and its clock (docs/PROTOCOL.md step 7: a rental planned in phases, ending with a
verified deliverable).

``tuneproof rental start`` records the window in the study folder as :data:`RENTAL_FILE` (written
atomically, ``rental_schema`` :data:`RENTAL_SCHEMA`): its start and end (seconds since the epoch,
UTC), the plan at that moment with the rates it used and where each came from (completed runs,
preflight, or :data:`DEFAULT_RATES`), then a ledger of every command that spends hours (its phase,
start and end read from :func:`tuneproof.clock.now` once each, its estimate, the runs it made, how
it ended), the overrides of the reserve with their reasons, the machines the study ran on and the
times the clock went back. The times are absolute and no path is stored, so a study copied to
another machine (a new rental of the same window) keeps its window and history; the new host is
recorded.

The reserve of a command is what the protocol still needs after it to end with a verified
deliverable (:func:`reserve`): the candidate's evaluation (after a data check, preflight, baseline,
train or resume), the sealed test read (after those and ``eval``), the export with its verification
in a fresh process, and one fresh-process re-read of a checkpoint (:data:`COMMAND_PHASE` says the
phase). A command is refused (exit 3) when ``now + its estimate`` passes ``end - reserve``.
"""

from __future__ import annotations

import math
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuneproof import procs
from tuneproof.deliver.bundle import MANIFEST, check_files, check_manifest_sha, read_manifest
from tuneproof.deliver.rental_plan import make_plan, measure
from tuneproof.deliver.rental_schema import validate
from tuneproof.errors import TuneproofError
from tuneproof.io import read_json, sha256_file, write_json

RENTAL_FILE = "rental.json"  # in the study folder, beside tuneproof.sqlite
RENTAL_SCHEMA = 1
CLOCK_SLACK_S = 60.0  # a clock seen this far behind the last recorded time went back (NTP steps are smaller)
RESERVE_STOP = "stopped: rental reserve"
PHASES = ("initial check", "experiment", "evaluation", "resume margin", "export")
#: command -> the plan's phase its hours count in
COMMAND_PHASE = {
    "data-check": "initial check",
    "baseline": "initial check",
    "preflight": "initial check",
    "train": "experiment",
    "resume": "resume margin",
    "eval": "evaluation",
    "test": "evaluation",
    "export": "export",
    "deliver": "export",
}
#: rates used when nothing was measured yet (assumed, stated as such; a preflight replaces them)
DEFAULT_RATES = {"s_per_step": 10.0, "eval_s_per_example": 1.0}
DEFAULT_DATA_CHECK_S = 60.0
K_VERIFY = 8  # examples an export stores and verify predicts again (``export --verify-examples``)


def iso_utc(ts: float) -> str:
    """``2026-12-05 12:00 UTC``."""
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def parse_ends(text: str) -> float:
    """Seconds since the epoch of an ISO-8601 time (``2026-12-05T12:00``, ``...Z``, ``...+02:00``;
    without an offset: UTC).

    Raises:
        TuneproofError: not an ISO-8601 time (exit 2), naming the value and the form expected.
    """
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise TuneproofError(
            f"--ends {text!r}: not an ISO-8601 time", hint="e.g. --ends 2026-12-05T12:00Z (UTC when no offset)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def load(study_dir: Path) -> dict[str, Any] | None:
    """The recorded rental (``<study_dir>/rental.json``), or None when no window was started; checked
    against its schema (:func:`tuneproof.deliver.rental_schema.validate`).

    Raises:
        TuneproofError: the file is not a rental record of a schema this version reads, a key is missing
            or of the wrong type, or ``delivered.bundle`` lies outside the study folder (exit 2).
    """
    path = Path(study_dir) / RENTAL_FILE
    if not path.exists():
        return None
    try:
        rental = read_json(path)
    except (ValueError, UnicodeDecodeError) as err:
        raise TuneproofError(
            f"{path}: not readable JSON ({err})", hint="restore it from a copy of the study, or start a new window"
        ) from None
    if not isinstance(rental, dict) or not isinstance(rental.get("ends"), (int, float)):
        raise TuneproofError(f"{path}: key 'ends' missing: not a rental record", hint="tuneproof rental start --days N")
    schema = rental.get("rental_schema", 0)
    if isinstance(schema, int) and schema > RENTAL_SCHEMA:
        raise TuneproofError(
            f"{path}: rental_schema {rental['rental_schema']} is newer than this tuneproof reads ({RENTAL_SCHEMA})",
            hint="upgrade tuneproof on this machine",
        )
    return validate(path, rental)


def save(study_dir: Path, rental: dict[str, Any]) -> Path:
    """Write the rental record atomically (schema-versioned)."""
    return write_json(Path(study_dir) / RENTAL_FILE, rental)


def rates(registry) -> dict[str, Any]:
    """The measured rates (:func:`tuneproof.deliver.rental_plan.measure`) with :data:`DEFAULT_RATES`
    in place of what nothing measured yet, each with its source (``rate_kinds``: measured runs,
    preflight or default)."""
    m = measure(registry)
    kinds = {}
    for key, src in (("s_per_step", "step_source"), ("eval_s_per_example", "eval_source")):
        if not m.get(key):
            m[key] = DEFAULT_RATES[key]
            m[src] = "default: nothing measured yet, run tuneproof preflight"  # the value is printed beside it
            kinds[key] = "default"
        else:
            from_preflight = (m.get(src) or "").startswith(("preflight", "one evaluation", "smoke"))
            kinds[key] = "preflight" if from_preflight else "runs"
    reload_src = m.get("reload_source") or ""
    kinds["reload_s"] = (
        "preflight" if reload_src.startswith("preflight") else "default" if reload_src.startswith("assumed") else "runs"
    )
    m["rate_kinds"] = kinds
    return m


def start(
    study_dir: Path, registry, *, days: float, ends: float | None, now: float, work: dict[str, int]
) -> dict[str, Any]:
    """Record a new window of ``days`` days from ``now`` (or ending at ``ends``) with the plan at
    this moment. ``work``: ``{"steps", "checkpoint_every", "n_eval", "n_test"}`` of the study.

    Raises:
        TuneproofError: a window is already recorded, ``days`` not > 0, or ``ends`` not after ``now``.
    """
    path = Path(study_dir) / RENTAL_FILE
    if path.exists():
        old = load(study_dir)
        raise TuneproofError(
            f"{path}: a rental window is already recorded (ends {iso_utc(old['ends'])})",
            hint="tuneproof rental status shows it; a new window needs a new study folder, or remove the file",
        )
    if not (math.isfinite(days) and days > 0):
        raise TuneproofError(f"--days {days:g}: the rental length must be a number of days > 0")
    end = ends if ends is not None else now + days * 86400.0
    if end <= now:
        raise TuneproofError(
            f"--ends {iso_utc(end)} is not after now ({iso_utc(now)})", hint="give the time the rental ends"
        )
    r = rates(registry)
    plan = make_plan(
        r,
        days=(end - now) / 86400.0,
        steps=max(1, work["steps"]),
        checkpoint_every=max(1, work["checkpoint_every"]),
        n_eval=work["n_eval"],
        n_test=work["n_test"],
    )
    host = socket.gethostname()
    rental = {
        "rental_schema": RENTAL_SCHEMA,
        "start": now,
        "ends": end,
        "days": (end - now) / 86400.0,
        "work": dict(work),
        "plan": {k: v for k, v in plan.items() if k != "measured"},
        "rates": {k: v for k, v in r.items() if k != "durations"},
        "commands": [],
        "overrides": [],
        "machines": [{"host": host, "first_seen": now}],
        "clock": {"last_seen": now, "went_back": []},
        "delivered": None,
    }
    save(study_dir, rental)
    return rental


def observe(rental: dict[str, Any], now: float, where: str) -> list[str]:
    """Note this clock reading and this machine in ``rental`` (in place); returns what to say: the
    clock went back (more than :data:`CLOCK_SLACK_S` behind the last recorded time), or the study
    runs on a machine it had not run on (a moved study keeps its window)."""
    said: list[str] = []
    clock = rental.setdefault("clock", {"last_seen": now, "went_back": []})
    last = float(clock.get("last_seen") or now)
    went_back = now < last - CLOCK_SLACK_S
    if went_back:
        clock["went_back"].append({"from": last, "to": now, "where": where, "host": socket.gethostname()})
        said.append(
            f"the clock went back {(last - now) / 3600:.2f} h ({iso_utc(last)} was recorded, it reads "
            f"{iso_utc(now)} at {where}): hours used count from the recorded times; check the machine's clock"
        )
    # after a step back the new reading is the reference: the step is named once, not at every command
    clock["last_seen"] = now if went_back else max(last, now)
    host = socket.gethostname()
    machines = rental.setdefault("machines", [])
    if machines and all(m.get("host") != host for m in machines):
        said.append(
            f"the study runs on {host}, not {machines[-1]['host']}: the rental window "
            f"(ends {iso_utc(rental['ends'])}) and its history are kept"
        )
    if all(m.get("host") != host for m in machines):
        machines.append({"host": host, "first_seen": now})
    return said


def reserve(r: dict[str, Any], work: dict[str, int], command: str) -> tuple[float, list[str]]:
    """Seconds the protocol still needs after ``command`` to end with a verified deliverable, and
    the parts (``["evaluation 0.42 h", ...]``); see the module docstring."""
    epx, reload_s = r["eval_s_per_example"], r.get("reload_s") or 0.0
    parts: list[tuple[str, float]] = []
    if command in ("data-check", "preflight", "baseline", "train", "resume"):
        parts.append(("candidate evaluation", work["n_eval"] * epx + reload_s))
    if command in ("data-check", "preflight", "baseline", "train", "resume", "eval"):
        parts.append(("test read", work["n_test"] * epx + reload_s))
    if command != "export":
        parts.append(("export + verify", export_s(r)))
        parts.append(("fresh-process re-read", reload_s))
    return sum(s for _, s in parts), [f"{name} {s / 3600:.2f} h" for name, s in parts]


def export_s(r: dict[str, Any]) -> float:
    """An export with its fresh-process verification: the latest measured one, else an estimate."""
    measured = (r.get("durations") or {}).get("export")
    return measured or 2 * (K_VERIFY * r["eval_s_per_example"] + (r.get("reload_s") or 0.0))


def estimate(
    r: dict[str, Any], work: dict[str, int], command: str, *, steps: int | None = None, variants: int = 1
) -> tuple[float, str]:
    """Seconds ``command`` is expected to take from the rates ``r`` and the basis in words.
    ``steps``: optimizer steps left to train (train: the budget; resume: from the checkpoint);
    ``variants``: train runs the command makes (``--grid``)."""
    sps, epx, reload_s = r["s_per_step"], r["eval_s_per_example"], r.get("reload_s") or 0.0
    dur = r.get("durations") or {}
    if command in ("train", "resume"):
        n = steps if steps is not None else work["steps"]
        s = variants * (n * sps + reload_s)
        return s, (f"{variants} x " if variants > 1 else "") + f"({n} steps x {sps:.3g} s/step + load {reload_s:.0f} s)"
    if command in ("eval", "baseline") and not (command == "baseline" and "baseline" in dur):
        return work["n_eval"] * epx + reload_s, f"{work['n_eval']} examples x {epx:.3g} s + load {reload_s:.0f} s"
    if command == "test":
        return work["n_test"] * epx + reload_s, f"{work['n_test']} examples x {epx:.3g} s + load {reload_s:.0f} s"
    if command == "export":
        return export_s(r), "the last export" if dur.get("export") else "export + verify in a fresh process"
    if command in dur:
        return dur[command], f"the last {command}"
    if command == "preflight":
        return 20 * sps + 2 * K_VERIFY * epx + reload_s, f"20 steps x {sps:.3g} s/step + smoke evaluation + reload"
    return DEFAULT_DATA_CHECK_S, "assumed 60 s"


def clock_shift(rental: dict[str, Any]) -> float:
    """Seconds the clock went back during the window (the steps :func:`observe` recorded, summed): what a
    reading lacks to count the time the window really used (a study moved to a machine whose clock is
    behind, an NTP step). A later step forward is not told apart from time passing, so hours left err
    on the short side, never past the window."""
    return sum(max(0.0, b["from"] - b["to"]) for b in (rental.get("clock") or {}).get("went_back") or [])


def command_hours(rental: dict[str, Any], c: dict[str, Any], now: float) -> tuple[float, float]:
    """``(hours counted, hours past the window's end)`` of one ledger entry: its start to end as read
    (a command still running: to ``now``), never below 0 (the clock went back while it ran), and only
    up to the window's end (the part past it is returned apart, so that a command the window ended
    in never counts more hours than the window has)."""
    end = c.get("end") if c.get("end") is not None else now
    span = max(0.0, end - c["start"])
    past = min(span, max(0.0, end - rental["ends"]))
    counted = min(span - past, rental["ends"] - rental["start"])
    return counted / 3600, past / 3600


def used_by_phase(rental: dict[str, Any], now: float) -> dict[str, float]:
    """Hours each phase used: the commands' measured start-to-end (a command still running counts
    up to ``now``), clamped to the window (:func:`command_hours`)."""
    used = dict.fromkeys(PHASES, 0.0)
    for c in rental.get("commands", []):
        used[c["phase"]] = used.get(c["phase"], 0.0) + command_hours(rental, c, now)[0]
    return used


def clock_flags(rental: dict[str, Any], now: float) -> list[str]:
    """What the status says about times it did not take as read: the clock went back (hours left count
    the steps), the reading lies before the window's start (hours left clamped to the window), a
    command ran past the window's end (counted up to it)."""
    flags = []
    shift = clock_shift(rental)
    if shift > 0:
        flags.append(
            f"the clock went back {shift / 3600:.2f} h in this window: hours left count from the recorded "
            f"times (the reading + {shift / 3600:.2f} h); check the machine's clock"
        )
    if now + shift < rental["start"]:
        flags.append(
            f"the clock reads {iso_utc(now)}, before the window's start {iso_utc(rental['start'])}: "
            f"hours left are clamped to the window ({(rental['ends'] - rental['start']) / 3600:.1f} h)"
        )
    for c in rental.get("commands", []):
        past = command_hours(rental, c, now)[1]
        if past > 0:
            runs = f" ({', '.join(c.get('runs') or [])})" if c.get("runs") else ""
            flags.append(
                f"{c['command']}{runs} ran {past:.2f} h past the window's end {iso_utc(rental['ends'])}: "
                "its hours count up to the end"
            )
    return flags


def close_orphans(rental: dict[str, Any], registry, now: float) -> list[str]:
    """End the ledger's open entries whose process is gone (``kill -9``, a lost machine), in place: an
    open entry otherwise counts hours up to every later reading. The end is the last time the command
    was seen: the latest end or heartbeat of the runs it made, else its start. Only an entry that
    recorded its process (``pid`` on this ``host``) is judged. Returns what to say."""
    said = []
    host = socket.gethostname()
    for c in rental.get("commands", []):
        if c.get("end") is not None or c.get("pid") is None or c.get("host") != host:
            continue
        if procs.alive(int(c["pid"]), c.get("proc_start")):
            continue
        seen = [c["start"]]
        first = c.get("first_seq")
        runs = [r for r in registry.list() if first is not None and r.seq >= first and r.created >= c["start"]]
        for r in runs:
            row = registry.row(r.id)
            seen += [t for t in (row.get("heartbeat"), r.ended, r.created) if isinstance(t, (int, float))]
        end = min(max(seen), now)
        c.update(
            end=end,
            status=f"killed: process {c['pid']} was gone (found {iso_utc(now)})",
            runs=c.get("runs") or [r.id for r in runs],
        )
        said.append(
            f"{c['command']} (pid {c['pid']}) ended without recording its end: counted up to "
            f"{iso_utc(end)}, the last time it was seen"
        )
    return said


def delivery(study_dir: Path, delivered: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recorded deliverable checked again now, before anything claims it verified: ``{"train",
    "bundle", "verified", "problem"}``. ``verified`` is True only when ``rental deliver`` recorded a
    passed fresh-process verification and the bundle is still there, inside the study folder, with
    the manifest then verified (``manifest_sha256``) and every file the manifest lists unchanged, and
    no other file (:func:`tuneproof.deliver.bundle.check_files`). ``problem``: why not, in words."""
    if not delivered:
        return None
    out = {"train": delivered.get("train"), "bundle": delivered.get("bundle"), "verified": False, "problem": None}
    if not delivered.get("verified"):
        out["problem"] = "its verification did not pass"
        return out
    study = Path(study_dir).resolve()
    bundle = (study / str(delivered.get("bundle"))).resolve()
    if not bundle.is_relative_to(study):
        out["problem"] = f"{delivered.get('bundle')} lies outside the study folder"
        return out
    try:
        man = read_manifest(bundle)
        problems = check_manifest_sha(bundle)
        want = delivered.get("manifest_sha256")
        if want and sha256_file(bundle / MANIFEST) != want:
            problems.append(f"{MANIFEST} is not the one verified at delivery")
        files = check_files(bundle, man.get("files") or {})
    except (TuneproofError, OSError) as err:
        out["problem"] = f"{delivered.get('bundle')}: {getattr(err, 'message', None) or err}"
        return out
    problems += [f"missing file: {p}" for p in files["missing"]]
    problems += [f"altered file: {a['path']}" for a in files["altered"]]
    problems += [f"extra file not in the manifest: {p}" for p in files["extra"]]
    if problems:
        out["problem"] = f"{delivered.get('bundle')} changed since it was verified: " + "; ".join(problems[:3])
        return out
    out["verified"] = True
    return out


def best_candidate(registry) -> dict[str, Any] | None:
    """The best candidate that passed its comparison: ``{"train", "eval", "compare", "delta"}`` (the
    first success criterion's difference, larger is better), or None when none passed."""
    best = None
    for cmp in registry.list(kind="compare", status="completed"):
        data = registry.run_json(cmp.id, "compare.json") or {}
        for cid, res in (data.get("candidates") or {}).items():
            if (res.get("overall") or {}).get("verdict") != "pass":
                continue
            try:
                rec = registry.get(cid)
            except TuneproofError:
                continue
            train = rec.parent if rec.kind == "eval" else rec.id
            delta = next(
                (
                    v["delta"]
                    for v in res.get("verdicts", [])
                    if v.get("kind") == "success" and isinstance(v.get("delta"), (int, float))
                ),
                0.0,
            )
            if best is None or delta > best["delta"]:
                best = {"train": train, "eval": cid, "compare": cmp.id, "delta": delta}
    return best


def verified_export(registry, study_dir: Path, delivered: dict[str, Any] | None) -> str | None:
    """The bundle verified in a fresh process during the window (``rental deliver``'s) and still as it
    was verified (:func:`delivery`), or None."""
    got = delivery(study_dir, delivered)
    return got["bundle"] if got and got["verified"] else None


def status(rental: dict[str, Any], registry, study_dir: Path, now: float, work: dict[str, int]) -> dict[str, Any]:
    """Where the window stands: phases planned vs used (hours, ratio), hours left, the reserve still
    needed, the stopped runs, the overrides, the best passed candidate and the next step."""
    r = rates(registry)
    reserve_s, parts = reserve(r, work, "train")
    # hours left as the window counts them: the reading plus the recorded steps back, never more than the window
    left_s = min(rental["ends"] - (now + clock_shift(rental)), rental["ends"] - rental["start"])
    used = used_by_phase(rental, now)
    planned = {p["phase"]: p["hours"] for p in rental["plan"]["phases"]}
    phases = [
        {
            "phase": ph,
            "planned_h": planned.get(ph, 0.0),
            "used_h": used.get(ph, 0.0),
            "ratio": (used[ph] / planned[ph]) if planned.get(ph) else None,
        }
        for ph in PHASES
    ]
    stopped = stopped_runs(rental, registry)
    best = best_candidate(registry)
    delivered = delivery(study_dir, rental.get("delivered"))
    verified = delivered["bundle"] if delivered and delivered["verified"] else None
    reserve_reached = left_s <= reserve_s
    deliver_commands = (
        [f"tuneproof export {best['train']}", f"tuneproof verify exports/{best['train']}", "tuneproof report"]
        if best
        else []
    )
    if verified:
        nxt = f"delivered: {verified} verified in a fresh process; the dossier is written"
    elif delivered:
        nxt = f"the delivery is not verified ({delivered['problem']}): deliver again with tuneproof rental deliver"
    elif reserve_reached or left_s <= 0:
        nxt = (
            f"deliver {best['train']}: tuneproof rental deliver (export, verify, report)"
            if best
            else "no candidate passed its comparison: deliver the evidence with tuneproof report"
        )
    else:
        nxt = next_protocol_step(registry)
    return {
        "start": rental["start"],
        "ends": rental["ends"],
        "now": now,
        "ended": left_s <= 0,
        "left_h": left_s / 3600,
        "reserve_h": reserve_s / 3600,
        "reserve_parts": parts,
        "reserve_reached": reserve_reached,
        "phases": phases,
        "rates": {
            "s_per_step": r["s_per_step"],
            "step_source": r["step_source"],
            "eval_s_per_example": r["eval_s_per_example"],
            "eval_source": r["eval_source"],
            "reload_s": r.get("reload_s"),
            "reload_source": r.get("reload_source"),
        },
        "start_rates": {k: rental["rates"].get(k) for k in ("step_source", "eval_source", "reload_source")},
        "overrides": rental.get("overrides", []),
        "stopped": stopped,
        "machines": rental.get("machines", []),
        "clock_went_back": (rental.get("clock") or {}).get("went_back", []),
        "flags": clock_flags(rental, now),
        "best_candidate": best,
        "deliver_commands": deliver_commands,
        "delivered": delivered,
        "commands": [
            {
                "command": c["command"],
                "phase": c["phase"],
                "estimate_h": c.get("estimate_s", 0.0) / 3600,
                "used_h": None if c.get("end") is None else command_hours(rental, c, now)[0],
                "past_end_h": command_hours(rental, c, now)[1],
                "status": c.get("status", "running"),
                "runs": c.get("runs", []),
            }
            for c in rental.get("commands", [])
        ],
        "next": nxt,
    }


def stopped_runs(rental: dict[str, Any], registry) -> list[dict[str, Any]]:
    """Train runs the reserve stopped, from the ledger (kept after a resume completed them) and the
    registry: ``[{"run", "reason", "status"}]`` (``status``: the run's status now)."""
    ids = [r for c in rental.get("commands", []) if c.get("status") == RESERVE_STOP for r in c.get("runs", [])]
    ids += [rec.id for rec in registry.list(kind="train") if (rec.reason or "").startswith(RESERVE_STOP)]
    out = []
    for rid in dict.fromkeys(ids):
        try:
            rec = registry.get(rid)
        except TuneproofError:
            continue
        if rec.kind != "train":
            continue
        at = next((x for x in rec.summary.get("resumes") or [] if isinstance(x, dict)), {})
        now_stopped = (rec.reason or "").startswith(RESERVE_STOP)
        reason = rec.reason if now_stopped else at.get("previous_reason") or RESERVE_STOP
        out.append({"run": rec.id, "reason": reason, "status": rec.status})
    return out


def next_protocol_step(registry) -> str:
    """The next step of the protocol from what the registry holds (the command to run)."""
    done = {k: registry.latest(k) for k in ("data-check", "baseline", "preflight", "train", "eval", "compare")}
    if done["data-check"] is None:
        return "tuneproof data check"
    if done["baseline"] is None:
        return "tuneproof baseline"
    if done["preflight"] is None:
        return "tuneproof preflight"
    if done["train"] is None:
        return "tuneproof train"
    if done["eval"] is None or done["eval"].seq < done["train"].seq:
        return f"tuneproof eval {done['train'].id}"
    if done["compare"] is None or done["compare"].seq < done["eval"].seq:
        return f"tuneproof compare {done['eval'].id}"
    return "a variant (tuneproof train --from RUN --set KEY=VALUE), or tuneproof rental deliver"
