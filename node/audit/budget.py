"""What audits may cost: a declared share of the learner's training time, held by construction.

    budget = AuditBudget(share=0.02)
    p = budget.spot_rate()                  # the affordable share of groups to spot-audit
    n = budget.admissible()                 # how many of new keys' first audits a step may run
    if budget.affords(budget.reference_s(groups)): ...      # the flip rate's bfloat16 pass
    budget.audited(seconds, groups, reference); budget.trained(seconds, groups)

Three kinds of audit draw on one balance, `share` x the seconds the learner trained minus the
seconds audits took (weights rebuilt, forwards, judging):

* **Spot audits** of proven samplers, at a rate derived from measured costs:
  p = SPOT x share x (training seconds per trained group) / (seconds per spot-audited group),
  so that auditing p of every step's groups costs SPOT x share of its training, in
  expectation. They never wait on the balance: a sampler cannot make the learner skip them by
  spending it (a flood of new keys would otherwise buy unaudited groups for an established one).
* **Admissions**, a new key's first `audit.first` audits: a step runs as many as the balance pays
  for above the reserve, each priced at a spot audit's measured cost per group (an admission
  audits a key's groups together, one rebuild per version, so it costs no more unless the key
  made its completions longer than proven samplers' are); a group waiting for one stays in the
  buffer. The other (1 - SPOT) of the share is theirs at steady state.
* **Calibration**, the flip rate's reference pass (node/audit/flips.FlipRate), only when the
  balance covers its estimated cost above the reserve: the least urgent, since the flip test holds
  samplers to the configured ceiling until it has measured enough.

The **reserve** is what the next step's spot audits may cost: their expected count n p plus three
standard deviations (it is binomial), in whole audits, at the measured cost per group. Admissions and calibration
spend only above it, so spot audits' luck in the step after them does not take the run over its
share (without it, calibration spent the balance to zero and bench_audit ended at 2.02%).

Over a run, audits cost at most `share` of the training time plus the estimates' error and spot
audits' luck beyond three standard deviations. The one exception is the learner's (not the
budget's): when no proven work waits it admits new keys anyway, since a learner with nothing
checked to train on has no training to protect (Auditor.admissions); their seconds are charged,
and new keys then wait while proven work trains in short steps and repays them.
"""

from __future__ import annotations

import math


class Ewma:
    """A per-unit cost (seconds per group) as decayed sums, sum(seconds) / sum(units), each older
    measurement weighing `keep` times less per new one: a measurement of few units moves it by
    its seconds, not by its seconds per unit."""

    def __init__(self, keep: float = 0.9) -> None:
        self.keep, self.seconds, self.units = keep, 0.0, 0.0

    def add(self, seconds: float, units: int) -> None:
        if units <= 0:
            return
        self.seconds = self.keep * self.seconds + seconds
        self.units = self.keep * self.units + units

    @property
    def known(self) -> bool:
        return self.units > 0

    @property
    def value(self) -> float:
        return self.seconds / self.units if self.units else math.nan

    def state_dict(self) -> dict[str, float]:
        return {"seconds": self.seconds, "units": self.units}

    def load_state_dict(self, state: dict) -> None:
        self.seconds, self.units = float(state.get("seconds", 0.0)), float(state.get("units", 0.0))


class AuditBudget:
    SPOT = 0.5
    """The share of the budget that spot audits are sized to spend; the rest admits new keys and
    measures the flip rate. Half: at steady state keys arrive rarely and the spot rate is what
    deters a proven sampler from cheating, but a swarm whose volunteers come and go by the dozens
    must still admit each within minutes (docs/BENCHMARKS.md, "Audits within a budget")."""

    RESERVE_SD = 3.0
    """Standard deviations of one step's spot-audit count the reserve covers, rounded up to whole
    audits (at the built-in model's n = 16, p = 0.4%: one audit, which a step exceeds with
    probability 0.2%; Cantelli's bound at any p: 10%). A shortfall costs one step's luck."""

    def __init__(self, share: float, reference_slowdown: float = 1.0, step_groups: int = 1) -> None:
        """`share`: audits' seconds per training second (math.inf: no budget, every audit the
        policy draws). `step_groups`: groups a step takes (the reserve's n). `reference_slowdown`: the reference pass's cost over the float32 audit's (the
        device's measured float32 / bfloat16 matmul rates: 50-150 on a CPU without bfloat16 units;
        on a GPU not measured). Priced per group, it includes the weights' rebuild the reference
        pass does not repeat: an overestimate, so calibration runs less often, never over budget."""
        self.share, self.reference_slowdown, self.step_groups = share, reference_slowdown, step_groups
        self.earned = 0.0
        self.spent = 0.0
        self.train_cost = Ewma()
        """Training seconds per trained group (the step, micro-batches to optimizer)."""
        self.audit_cost = Ewma()
        """Seconds per spot-audited group (float32 audits without the reference pass)."""

    @property
    def unbounded(self) -> bool:
        return math.isinf(self.share)

    @property
    def balance(self) -> float:
        return math.inf if self.unbounded else self.earned - self.spent

    def trained(self, seconds: float, groups: int) -> None:
        """A step trained `groups` groups in `seconds`: its share is earned."""
        if not self.unbounded:
            self.earned += self.share * seconds
        self.train_cost.add(seconds, groups)

    def audited(self, seconds: float, groups: int, reference: bool, spot: bool = True) -> None:
        """Audits of `groups` groups took `seconds` (with the reference pass or not). Per group, not
        per token: a spot audit is mostly one group at its own version, whose weights are rebuilt
        for it, a fixed cost a token count would hide. Only spot audits measure the cost the spot
        rate is sized by: admissions audit groups a key not yet proven shaped as it liked, several
        at one version (one rebuild), which would move it."""
        self.spent += seconds
        if spot:
            self.audit_cost.add(seconds / (1 + self.reference_slowdown) if reference else seconds, groups)

    def spot_rate(self) -> float:
        """The share of a proven sampler's groups the budget affords to spot-audit (1 until both
        costs are measured: the first steps measure them, at the policy's rates)."""
        if self.unbounded or not (self.train_cost.known and self.audit_cost.known) or self.audit_cost.value <= 0:
            return 1.0
        return min(1.0, self.SPOT * self.share * self.train_cost.value / self.audit_cost.value)

    def reserve(self) -> float:
        """Seconds the balance keeps back for the next step's spot audits: ceil(n p + 3 sd) audits
        (n a step's groups, p the spot rate; their count is binomial) at the measured cost per
        group; 0 until measured."""
        if self.unbounded or not self.audit_cost.known:
            return 0.0
        n, p = self.step_groups, self.spot_rate()
        return self.audit_cost.value * math.ceil(n * p + self.RESERVE_SD * math.sqrt(n * p * (1 - p)) - 1e-9)

    def admissible(self) -> int:
        """How many groups of new keys' first audits a step may run now: as many as the balance
        pays for above the reserve, at a spot audit's cost per group; a step's worth while the cost
        is unmeasured and the balance not negative (the first step measures it)."""
        if self.unbounded:
            return self.step_groups
        if not self.audit_cost.known or self.audit_cost.value <= 0:
            return self.step_groups if self.balance >= 0 else 0
        affordable = (self.balance - self.reserve()) / self.audit_cost.value
        return max(0, min(self.step_groups, math.floor(affordable)))

    def reference_s(self, groups: int) -> float:
        """The estimated cost of the reference pass over `groups` audited groups."""
        if not self.audit_cost.known:
            return math.inf if not self.unbounded else 0.0
        return self.reference_slowdown * self.audit_cost.value * groups

    def affords(self, seconds: float) -> bool:
        """Whether the balance covers `seconds` more of audits and still holds the reserve."""
        return self.balance - self.reserve() >= seconds

    def state_dict(self) -> dict:
        return {"earned": self.earned, "spent": self.spent, "train_cost": self.train_cost.state_dict(),
                "audit_cost": self.audit_cost.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.earned, self.spent = float(state.get("earned", 0.0)), float(state.get("spent", 0.0))
        self.train_cost.load_state_dict(state.get("train_cost", {}))
        self.audit_cost.load_state_dict(state.get("audit_cost", {}))

    def stats(self) -> dict[str, float]:
        return {"budget_earned_s": round(self.earned, 4), "budget_spent_s": round(self.spent, 4),
                "spot_rate": round(self.spot_rate(), 5)}
