"""Progress when stdout is not a terminal (CI, nohup, log files): plain lines with step, info,
rate and ETA, every N seconds or 10 %, never silence until the end."""

from __future__ import annotations


def test_line_progress_prints_every_decile_and_every_n_seconds_with_rate_and_eta():
    from tuneproof.ui import LineProgress

    now = [0.0]
    lines: list[str] = []
    p = LineProgress("train", 400, every_s=30.0, out=lines.append, clock=lambda: now[0])
    for step in range(1, 401):
        now[0] = step * 0.5  # 2 steps per second: a decile (40 steps) every 20 s, sooner than 30 s
        p.advance(1, f"loss {1.0 / step:.3f}")
    assert len(lines) == 10
    assert lines[0] == "train: 40/400 (10%) loss 0.025 | 2.00 it/s | elapsed 0:00:20 | ETA 0:03:00"
    assert lines[-1] == "train: 400/400 (100%) loss 0.003 | 2.00 it/s | elapsed 0:03:20 | ETA 0:00:00"


def test_a_slow_run_prints_a_line_every_n_seconds_between_deciles():
    from tuneproof.ui import LineProgress

    now = [0.0]
    lines: list[str] = []
    p = LineProgress("train", 1000, every_s=30.0, out=lines.append, clock=lambda: now[0])
    for step in range(1, 1001):
        now[0] = float(step)  # 1 step per second: a decile every 100 s
        p.advance()
    assert [line.split(" | ")[0] for line in lines[:5]] == [
        "train: 30/1000 (3%)",
        "train: 60/1000 (6%)",
        "train: 90/1000 (9%)",
        "train: 100/1000 (10%)",
        "train: 130/1000 (13%)",
    ]
    assert len(lines) == 40
    assert lines[0].endswith("| 1.00 it/s | elapsed 0:00:30 | ETA 0:16:10")


def test_plain_lines_when_the_console_is_not_a_terminal(capsys):
    from tuneproof.ui import console, progress_bar

    assert not console.is_terminal  # pytest captures stdout
    with progress_bar("eval", 3) as advance:
        for _ in range(3):
            advance()
    out = capsys.readouterr().out
    assert "eval: 1/3 (33%)" in out and "eval: 3/3 (100%)" in out


def test_a_batch_that_takes_minutes_still_prints_a_line_every_n_seconds():
    """Between two advances (one long generation batch) the line comes again after every_s."""
    from tuneproof.ui import LineProgress

    now = [0.0]
    lines: list[str] = []
    p = LineProgress("baseline", 287, every_s=30.0, out=lines.append, clock=lambda: now[0])
    p.advance(32)  # the first batch: a decile, a line
    for t in (10.0, 29.0, 31.0, 45.0, 62.0):  # the second batch takes 2 minutes
        now[0] = t
        p.beat()
    assert [line.split(" | ")[0] + " | " + line.split(" | ")[2] for line in lines] == [
        "baseline: 32/287 (11%) | elapsed 0:00:00",
        "baseline: 32/287 (11%) | elapsed 0:00:31",
        "baseline: 32/287 (11%) | elapsed 0:01:02",
    ]


def test_a_phase_without_a_bar_says_what_it_does_every_n_seconds():
    from tuneproof.ui import Heartbeat

    now = [100.0]
    lines: list[str] = []
    beat = Heartbeat("export", "writing the bundle", every_s=30.0, out=lines.append, clock=lambda: now[0])
    now[0] = 120.0
    assert not beat.beat()
    now[0] = 131.0
    beat.update("verifying the bundle in a fresh process", done=2, total=5)
    assert beat.beat()
    now[0] = 150.0
    beat.touch()  # the phase printed a line of its own
    now[0] = 170.0
    assert not beat.beat()
    assert lines == ["export: verifying the bundle in a fresh process (2/5) | elapsed 0:00:31"]


def test_the_heartbeat_thread_prints_off_a_terminal(capsys):
    import threading

    from tuneproof import ui

    assert not ui.console.is_terminal
    printed = threading.Event()
    with ui.heartbeat("export", "verifying", every_s=0.02) as beat:
        beat.out = lambda line: (print(line), printed.set())
        assert printed.wait(10)  # the thread, not the block, printed it
    assert capsys.readouterr().out.startswith("export: verifying | elapsed 0:00:00")


def test_verify_says_what_it_does_while_the_fresh_process_runs(monkeypatch, capsys, tmp_path):
    """A command whose one phase is a child process (verify, export) is not silent off a terminal:
    the heartbeat's line comes while the phase runs (here a fake verification that waits for it)."""
    import threading

    import tuneproof.recipes.verify as verify_recipe
    from tuneproof import ui

    said = threading.Event()
    line = ui.Heartbeat.line
    monkeypatch.setattr(ui.Heartbeat, "line", lambda self: (said.set(), line(self))[1])
    monkeypatch.setenv("TUNEPROOF_PROGRESS_EVERY", "0.02")

    def fake_verify(bundle, base, device=None):
        assert said.wait(10)  # the phase is still running when the line is printed
        return {"passed": True, "checks": [], "seconds": 1.0}

    monkeypatch.setattr(verify_recipe, "verify_in_fresh_process", fake_verify)
    verify_recipe.run_verify(tmp_path / "bundle")
    out = capsys.readouterr().out
    assert out.startswith(
        "verify: reloading the bundle and predicting its examples in a fresh process | elapsed 0:00:0"
    )


def test_a_heartbeat_keeps_quiet_while_a_progress_bar_inside_it_prints():
    """baseline: the phase's heartbeat and the evaluation bar's repeated line said the same thing
    twice every 30 s; the bar speaks for the phase while it runs."""
    from tuneproof.ui import Heartbeat, progress_bar

    lines: list[str] = []
    beat = Heartbeat("baseline", "evaluating 7 examples", every_s=0.0, out=lines.append)
    with progress_bar("baseline", 7) as advance:
        advance(0)
        assert not beat.beat()
    assert beat.beat() and lines == [lines[0]] and lines[0].startswith("baseline: evaluating 7 examples | elapsed")


def test_a_resumed_run_counts_its_earlier_steps_in_the_position_not_in_the_rate():
    # a resume from step 10 of 40 printed "train: 10/40 (25%) | 1173433.48 it/s | ETA 0:00:00"
    from tuneproof.ui import LineProgress

    now = [0.0]
    lines: list[str] = []
    p = LineProgress("train", 40, every_s=30.0, out=lines.append, clock=lambda: now[0], start=10)
    for step in range(11, 41):
        now[0] = (step - 10) * 4.0  # 0.25 steps per second in this process
        p.advance(1, f"loss {1.0 / step:.3f}")
    assert lines[0] == "train: 12/40 (30%) loss 0.083 | 0.25 it/s | elapsed 0:00:08 | ETA 0:01:52"
    assert lines[-1] == "train: 40/40 (100%) loss 0.025 | 0.25 it/s | elapsed 0:02:00 | ETA 0:00:00"
    assert len(lines) == 8  # 30%, 40%, ..., 100%: no line for the 25% done before


def test_progress_bar_off_a_terminal_starts_at_the_resumed_step(capsys):
    from tuneproof.ui import progress_bar

    with progress_bar("train", 4, start=2) as advance:
        advance()
    out = capsys.readouterr().out
    assert out.startswith("train: 3/4 (75%)") and "train: 2/4" not in out
