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
