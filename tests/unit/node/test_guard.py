"""The divergence guard (node/training/guard.py): the lr scale's rule by hand, its bounds, and a learner
that slows down on a runaway and comes back."""

import math

import pytest

from node.training.guard import GuardConfig, guard_scale


def test_the_scale_halves_above_the_band_grows_below_and_holds_within():
    cfg = GuardConfig(kl_high=0.05, kl_low=0.02, down=0.5, up=1.25, min_scale=1 / 16)
    s = 1.0
    trace = []
    for kl in (0.001, 0.3, 0.2, 0.03, 0.9, 0.9, 0.9, 0.9, 0.01, 0.01, float("nan"), 0.0):
        s = guard_scale(s, kl, cfg)
        trace.append(s)
    assert trace == pytest.approx([1.0, 0.5, 0.25, 0.25, 0.125, 0.0625, 0.0625, 0.0625,
                                   0.078125, 0.09765625, 0.09765625, 0.1220703125])


def test_back_to_one_and_never_above():
    cfg = GuardConfig()
    s = cfg.min_scale
    steps = 0
    while s < 1.0:
        s = guard_scale(s, 0.0, cfg)
        steps += 1
    assert s == 1.0 and steps == math.ceil(math.log(16) / math.log(1.25))  # 13 settled steps from the floor


def test_a_disabled_guard_keeps_the_lr():
    assert guard_scale(0.25, 5.0, GuardConfig(enabled=False)) == 1.0


@pytest.mark.parametrize("bad", [dict(kl_low=0.1, kl_high=0.05), dict(down=1.0), dict(up=0.9), dict(min_scale=0.0),
                                 dict(kl_low=-1.0)])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="learner.guard"):
        GuardConfig(**bad)
