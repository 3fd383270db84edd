"""The spread limit behind NAT that bench_wan prints beside the one-copy limit, by hand."""

import math

from examples.bench_wan import nat_copy_times


def test_six_of_eight_behind_nat_leave_two_uplinks_for_every_copy_but_the_learners():
    # as the swarm runs: 8 copies, the learner's 1, the other 7 over 2 public uplinks = 3.5;
    # were private samplers to serve public ones: only the 6 private copies, 5 over 2 = 2.5
    assert nat_copy_times(8, 6, 1.0) == (3.5, 2.5)
    assert nat_copy_times(8, 6, 2.0) == (3.0, 2.0)  # 2x the one-copy limit needs 2 learner copies


def test_a_public_swarm_is_bound_by_one_copy_and_an_all_private_one_cannot_spread():
    assert nat_copy_times(8, 0, 1.0) == (1.0, 1.0)  # 7/8 and -1/8: a sampler's own downlink binds
    assert nat_copy_times(8, 8, 1.0) == (math.inf, math.inf)
