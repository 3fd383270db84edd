"""Where a learner's time goes (node/learner/phases.py), on a clock the test moves."""

import pytest

from node.learner.phases import Phases, phase_table


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_phases_add_up_with_other_as_the_rest_of_the_wall_time():
    clock = Clock()
    p = Phases(clock)
    with p("waiting"):
        clock.t += 2.0
    clock.t += 0.5  # between phases: "other"
    with p("train"):
        clock.t += 3.0
        with p("audit"):  # nested: the outer phase counts it
            clock.t += 1.0
    with p("train"):
        clock.t += 1.5
    snap = p.snapshot()
    assert snap["waiting"] == 2.0 and snap["train"] == 5.5 and snap["audit"] == 0.0 and snap["other"] == 0.5
    assert sum(snap.values()) == pytest.approx(clock.t - 100.0)


def test_a_phase_that_raises_is_still_counted_and_unknown_phases_are_refused():
    clock = Clock()
    p = Phases(clock)
    with pytest.raises(RuntimeError):
        with p("eval"):
            clock.t += 4.0
            raise RuntimeError("boom")
    assert p.snapshot()["eval"] == 4.0
    with p("intake"):  # the failed phase closed: this one counts
        clock.t += 1.0
    assert p.snapshot()["intake"] == 1.0
    with pytest.raises(ValueError, match="unknown phase 'nap'"):
        with p("nap"):
            pass


def test_the_table_is_largest_first_with_shares():
    rows = phase_table({"train": 6.0, "waiting": 3.0, "eval": 1.0, "audit": 0.0})
    assert rows == [("train", 6.0, 0.6), ("waiting", 3.0, 0.3), ("eval", 1.0, 0.1)]
