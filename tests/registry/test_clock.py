"""The one time source: the registry records the injected clock's times, and a stop time set for a
train run is read through the same clock."""

from __future__ import annotations

from tuneproof import clock
from tuneproof.registry import Registry


def test_run_times_come_from_the_injected_clock(tmp_path):
    t = [1_000_000.0]
    with clock.use(lambda: t[0]):
        reg = Registry(tmp_path)
        with reg.run("baseline") as r:
            t[0] += 3600.0
        rec = reg.get(r.id)
    assert (rec.created, rec.ended) == (1_000_000.0, 1_003_600.0)
    assert clock.now() > 1_700_000_000  # the machine's clock again after the block


def test_stop_reason_follows_the_clock_and_is_cleared_after_the_block():
    t = [50.0]
    with clock.use(lambda: t[0]), clock.stop_at(100.0, "stopped: rental reserve"):
        assert clock.stop_reason() is None
        t[0] = 100.0
        assert clock.stop_reason() == "stopped: rental reserve"
    assert clock.stop_reason() is None
