"""The audit budget (node/audit/budget.py): figures by hand, and a learner that keeps a new key's
groups waiting while its audits would go over budget."""

from __future__ import annotations

import math

import pytest

from node.audit.budget import AuditBudget, Ewma
from node.learner.config import AuditConfig, LearnerConfig


def test_the_spot_rate_spends_half_the_share_at_the_measured_costs():
    b = AuditBudget(0.02)
    assert b.spot_rate() == 1.0  # nothing measured yet: the policy's rates decide
    b.trained(2.0, 1000)  # 2 ms of training per group
    b.audited(0.5, 250, reference=False)  # 2 ms to spot-audit a group
    # 0.5 x 0.02 x 2 ms / 2 ms = 1%: auditing 1% of the groups costs 1% of what training them did
    assert b.spot_rate() == pytest.approx(0.01)
    b2 = AuditBudget(0.02)
    b2.trained(2.0, 1000)
    b2.audited(0.1, 250, reference=False)  # audits 5x cheaper (0.4 ms) than training a group
    assert b2.spot_rate() == pytest.approx(0.05)


def test_new_keys_are_admitted_as_far_as_the_balance_pays_above_the_reserve():
    b = AuditBudget(0.02, step_groups=16)
    assert b.admissible() == 16 and b.reserve() == 0.0  # nothing measured: the first step's admissions run
    b.audited(0.5, 250, reference=False)  # 2 ms to spot-audit a group
    b.trained(2.0, 1000)  # 2 ms to train one; earned 0.04 s, spent 0.5 s
    assert b.balance == pytest.approx(-0.46) and b.admissible() == 0
    # p = 0.5 x 0.02 x 2 / 2 = 1%; of 16 groups n p = 0.16 spot audits, sd sqrt(16 x 0.01 x 0.99) = 0.398:
    # 0.16 + 3 x 0.398 = 1.35, so 2 whole audits, 4 ms
    assert b.reserve() == pytest.approx(0.004)
    b.trained(23.0, 0)  # earned 0.46 more: balance 0, all of it the reserve's
    assert b.balance == pytest.approx(0.0, abs=1e-12) and b.admissible() == 0
    b.trained(0.65, 0)  # 13 ms more: (13 - 4) / 2 = 4.5 admissions paid for
    assert b.admissible() == 4
    b.trained(100.0, 0)
    assert b.admissible() == 16  # at most a step's worth


def test_the_reference_pass_is_priced_by_the_devices_measured_slowdown():
    b = AuditBudget(0.02, reference_slowdown=50.0)
    assert b.reference_s(10) == math.inf  # no audit measured yet: never affordable
    b.audited(5.1, 100, reference=True)  # 1 + 50 float32 passes' worth: 0.1 s a float32 pass, 1 ms a group
    assert b.audit_cost.value == pytest.approx(1e-3)
    assert b.reference_s(10) == pytest.approx(0.5)  # 50 x 1 ms x 10
    b.trained(300.0, 1000)  # earned 6 s, spent 5.1
    # p is 1 (audits are cheap next to 0.3 s of training per group): the reserve is one audit, 1 ms
    assert b.reserve() == pytest.approx(0.001)
    assert b.affords(0.8985) and not b.affords(0.8995)


def test_an_unbounded_budget_is_every_audit_the_policy_draws():
    b = AuditBudget(math.inf, reference_slowdown=100.0)
    b.trained(1.0, 10)
    b.audited(100.0, 10, reference=True)
    assert b.spot_rate() == 1.0 and b.admissible() == 1 and b.affords(1e9) and b.reference_s(1000) < math.inf


def test_costs_are_decayed_sums_so_a_tiny_measurement_weighs_by_its_units():
    e = Ewma(keep=0.5)
    e.add(1.0, 0)  # nothing measured
    assert not e.known
    e.add(2.0, 1000)
    e.add(6.0, 1000)
    # seconds 0.5 x 2 + 6 = 7, units 0.5 x 1000 + 1000 = 1500
    assert e.value == pytest.approx(7 / 1500)
    e.add(0.1, 1)  # one unit that cost 0.1 s
    # seconds 3.5 + 0.1 = 3.6, units 750 + 1 = 751: 4.79 ms a unit, not the 50 ms a per-call mean gives
    assert e.value == pytest.approx(3.6 / 751)


def test_admissions_are_charged_but_do_not_set_the_spot_rate():
    b = AuditBudget(0.02)
    b.trained(2.0, 1000)  # 2 ms a group
    b.audited(0.5, 250, reference=False)  # spot audits: 2 ms a group
    b.audited(5.0, 10, reference=False, spot=False)  # a new key's admission, shaped as it liked
    assert b.audit_cost.value == pytest.approx(0.002) and b.spot_rate() == pytest.approx(0.01)
    assert b.spent == pytest.approx(5.5)


def test_the_budget_survives_a_restart():
    b = AuditBudget(0.02)
    b.trained(10.0, 1000)
    b.audited(0.1, 50, reference=False)
    again = AuditBudget(0.02)
    again.load_state_dict(b.state_dict())
    assert (again.earned, again.spent, again.spot_rate()) == (b.earned, b.spent, b.spot_rate())


def test_the_budget_is_checked_as_a_config():
    with pytest.raises(ValueError, match="budget > 0"):
        LearnerConfig(audit=AuditConfig(budget=0.0))


def test_a_new_key_waits_in_the_buffer_until_the_budget_admits_it(task, tmp_path):
    from helpers.inmemory import tiny_swarm

    s = tiny_swarm(tmp_path, groups_per_step=2, samplers=0, task=task, start=True,
                   audit=AuditConfig(first=2, budget=1e-9))
    learner, honest, late = s.learner, s.add_sampler("honest"), s.add_sampler("late")
    learner.ingest_many([g.encode() for g in honest.produce(2)])
    # no proven work waits, so the first step admits whatever it costs
    assert learner.ready() and learner.step() is not None and learner.is_proven("honest")
    assert learner.auditor.budget.admissible() == 0  # one step's admissions overshoot a budget this small
    learner.ingest_many([g.encode() for g in late.produce(2)])
    learner.ingest_many([g.encode() for g in honest.produce(2)])
    rec = learner.step()  # the proven sampler's two groups; the new key's wait
    assert rec is not None and learner.auditor.audits["late"] == 0 and learner.untrained("late") == 2
    learner.ingest_many([g.encode() for g in honest.produce(1)][:1])
    # one proven group and the new key's two: it trains the one (a short step) rather than wait, as
    # only training refills the budget
    assert learner.ready() and learner.step()["groups_own"] == 1 and learner.untrained("late") == 2
    # as if the learner had trained long enough to repay: 1,000 s of audits at this budget's 1e-9 share.
    # 1e9 s earned 1 s, less the reserve for the next step's spot audits at the measured cost of
    # one: with both cores busy that paid for one admission, not two (failed 2 of 3 runs)
    learner.auditor.budget.trained(1e12, 1)
    learner.ingest_many([g.encode() for g in honest.produce(2)])
    while learner.ready():
        learner.step()
    assert learner.auditor.audits["late"] == 2 and learner.is_proven("late") and learner.untrained("late") == 0
