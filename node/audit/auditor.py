"""Spot audits of own-model groups (checkable sampling, node/audit/margins.py and node/sampling/race.py), and
what they decide: which samplers are proven, and which are refused for good, all within a declared
share of the learner's training time (node/audit/budget.py).

The auditor owns the published versions rebuilt for audits (`VersionArchive`), the refusal list
(on disk: a refusal survives restarts), a second copy of the model that audits run on (made for a
step's audits and let go after them, so a training step never holds it), and per-sampler audit
counts.
"""

from __future__ import annotations

import collections
import copy
import functools
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from node.audit.budget import AuditBudget
from node.audit.margins import AuditItem, AuditResult, audit_groups
from node.audit.flips import FlipRate, FlipTest
from node.audit.refusals import RefusalList
from node.audit.archive import VersionArchive
from node.sampling.race import group_seeds
from node.sampling.params import SamplingConfig
from node.device import matmul_rates
from node.weights.blob import retie
from node.audit.claim_gaps import ClaimGaps
from node.learner.config import LearnerConfig
from node.learner.groups import BufferedGroup, GroupKind, Verdict

log = logging.getLogger(__name__)

NEW_STATS = {"audits": 0, "failed": 0, "unauditable": 0, "positions": 0, "flips": 0, "exceedances": 0, "time_s": 0.0,
             "logprob_gap_max": 0.0, "margin_max": 0.0, "flip_rate": 0.0, "waiting": 0, "reference_positions": 0}


@dataclass
class AuditOutcome:
    """What a step's audits decided."""

    failed: dict[str, str]
    """Samplers that failed, each with the reason of its first failure."""
    waiting: list[BufferedGroup]
    """Groups of keys not yet proven beyond the first audits each still needs (this step's audits
    may prove it): they go back to the buffer, untrained. Whether a new key's groups are taken at
    all is the buffer's `admissions` cap."""


class Auditor:
    def __init__(self, cfg: LearnerConfig, model: torch.nn.Module, aliases: dict[str, str], sampling: SamplingConfig,
                 pad_id: int, archive: VersionArchive, refusals: RefusalList, peer_id: str,
                 measures_claims: bool = True) -> None:
        """`measures_claims`: audits count each sampler's claim gap (`claim_gaps`). Only where the
        learner computes in float32, as the audit's forward does: a learner in bfloat16 computes p
        in bfloat16, and measures the gap against that by recomputing (node/learner/behaviour.py)."""
        self.cfg, self.model, self._aliases, self.sampling, self.pad_id = cfg, model, aliases, sampling, pad_id
        self.archive, self.refusals, self.peer_id, self.measures_claims = archive, refusals, peer_id, measures_claims
        self.audits: collections.Counter[str] = collections.Counter()
        """Audits done per sampler (the first `audit_first` of each are always done)."""
        self.flip_test = FlipTest(cfg.audit.flip_rate, cfg.audit.alarm / 2)
        """Each sampler's flips over all its audited positions (node/audit.FlipTest)..."""
        self.flip_rate = FlipRate()
        """...against the honest rate measured on this model (node/audit.FlipRate)."""
        self.exceed_test = FlipTest(cfg.audit.exceed_rate, cfg.audit.alarm / 2, events="tokens past the margin")
        """Each sampler's exceedances (margins past `audit.margin`), against `audit.exceed_rate`."""
        self.claim_gaps = ClaimGaps(cfg.behaviour.auto_k3)
        """How far each sampler's claimed log-probs sit from ours, measured by every audit and every
        recomputed group (node/audit/claim_gaps.py; what `behaviour_logprobs = "auto"` reads)."""
        self.stats: dict[str, Any] = dict(NEW_STATS)
        """Running counts (the budget's figures join them in step records: `AuditBudget.stats`)."""
        self._copy: torch.nn.Module | None = None
        self._rng = random.SystemRandom()  # the sampler must not predict which groups get audited

    @functools.cached_property
    def budget(self) -> AuditBudget:
        """What audits may cost (node/audit/budget.py): `audit.budget` of the training time; the
        reference pass's cost per position from the device's measured float32 / bfloat16 rates."""
        f32, bf16 = matmul_rates(str(next(self.model.parameters()).device))
        return AuditBudget(self.cfg.audit.budget, f32 / bf16, self.cfg.groups_per_step)

    def is_proven(self, peer: str) -> bool:
        """Whether `peer` passed its first `audit_first` audits and was never refused."""
        return peer not in self.refusals and self.audits[peer] >= self.cfg.audit.first

    def kind_of(self, b: BufferedGroup) -> GroupKind:
        """Which share of a step `b` may fill: never audited (foreign), a version we cannot rebuild
        from a key not yet proven (nothing of it was ever checked), or checked work."""
        if not b.own:
            return GroupKind.FOREIGN
        if b.sampler == self.peer_id:
            return GroupKind.CHECKED  # made here with these weights (ingest_own): nothing to prove
        if not self.archive.auditable(b.chain, b.claimed_version) and not self.is_proven(b.sampler):
            return GroupKind.UNAUDITED
        return GroupKind.NEW if self._is_new(b) else GroupKind.CHECKED

    def admissions(self, buffered: Iterable[BufferedGroup]) -> int:
        """How many groups of keys short of their first audits (`GroupKind.NEW`) the next step may
        take: what the budget pays for (`AuditBudget.admissible`), or a step's worth while no proven
        work waits (a learner with nothing checked to train on has no training to protect)."""
        n = self.budget.admissible()
        if n < self.cfg.groups_per_step and all(self.kind_of(b) is not GroupKind.CHECKED for b in buffered):
            return self.cfg.groups_per_step
        return n

    def rate(self, sampler: str) -> float:
        """The share of `sampler`'s groups audited once past its first `audit_first`: the policy's
        (heavier while its record is short), at most what the budget affords (`spot_rate`)."""
        trusted = self.audits[sampler] >= self.cfg.audit.established_after
        return min(self.cfg.audit.rate_established if trusted else self.cfg.audit.rate, self.budget.spot_rate())

    def draw(self, sampler: str) -> bool:
        """True with probability `rate(sampler)`, unpredictably to the sampler."""
        return self._rng.random() < self.rate(sampler)

    def audit(self, taken: list[BufferedGroup]) -> AuditOutcome:
        """Audit a chosen share of `taken` (each chosen group's `verdict` is set): the first audits a
        key not yet proven still needs (the step took them within `admissions`), the rest at
        `rate`. The caller `release`s the audit copy once the step needs it no more."""
        admitting: collections.Counter[str] = collections.Counter()  # this step's first audits, per new key
        chosen, waiting = [], []
        for b in taken:
            if not b.own or b.sampler == self.peer_id:  # (foreign: never audited; own: made here)
                continue
            if self.audits[b.sampler] < self.cfg.audit.first and not self.archive.auditable(b.chain, b.claimed_version):
                b.verdict = Verdict.UNAUDITABLE  # an earlier run's chain: the buffer's unaudited share
                self.stats["unauditable"] += 1
            elif self._is_new(b):
                if self.audits[b.sampler] + admitting[b.sampler] >= self.cfg.audit.first:
                    waiting.append(b)  # not proven yet, nor by this step's audits: untrained until it is
                    continue
                admitting[b.sampler] += 1
                chosen.append(b)
            elif self.draw(b.sampler):
                chosen.append(b)
        self.stats["waiting"] += len(waiting)
        # one forward pass per claimed version (its weights rebuilt and loaded once), spot audits
        # apart from admissions: only theirs measure the cost the spot rate is sized by
        by_version: dict[tuple[str, int, bool], list[BufferedGroup]] = {}
        for b in chosen:
            by_version.setdefault((b.chain, b.claimed_version, b.sampler in admitting), []).append(b)
        failed: dict[str, str] = {}
        for (chain, version, admission), groups in sorted(by_version.items()):
            whys = self._audit_version((chain, version), groups, spot=not admission)
            for b, why in zip(groups, whys):
                if b.verdict is Verdict.FAILED:
                    failed.setdefault(b.sampler, why)
        return AuditOutcome(failed, waiting)  # the copy stays for the step's recomputed log-probs

    def _is_new(self, b: BufferedGroup) -> bool:
        """Whether `b`'s sampler is short of its first audits (at a version we can audit it at:
        a version we cannot rebuild is the buffer's `UNAUDITED` share, not an admission)."""
        return (b.own and b.sampler != self.peer_id and self.audits[b.sampler] < self.cfg.audit.first
                and self.archive.auditable(b.chain, b.claimed_version))

    def model_at(self, key: tuple[str, int]) -> torch.nn.Module | None:
        """The audit copy of the model with the published weights of `key` (chain, version)
        loaded; None if they cannot be rebuilt."""
        weights = self.archive.weights(*key)
        if weights is None:
            return None
        if self._copy is None:
            self._copy = copy.deepcopy(self.model).eval()
        self._copy.load_state_dict(retie(weights, self._aliases))
        return self._copy

    def release(self) -> None:
        """Let the audit copy go until the next step's audits: kept, it would sit through the
        training step that follows, 4 bytes a parameter at the step's peak (activations and
        gradients); making it again costs a copy of the weights (0.5 s for 219M parameters on this
        CPU) in a step of minutes."""
        self._copy = None

    def _audit_version(self, key: tuple[str, int], groups: list[BufferedGroup], spot: bool = True) -> list[str]:
        """Audit groups that claim the same version; sets each one's verdict; the failures' reasons.
        `spot`: whether their cost sizes the spot rate (AuditBudget.audited)."""
        t0 = time.perf_counter()
        nonce = self.archive.nonce(*key)
        model = self.model_at(key) if nonce is not None else None
        if model is None:
            self.stats["unauditable"] += len(groups)
            for b in groups:
                b.verdict = Verdict.UNAUDITABLE
            return [""] * len(groups)
        items = [AuditItem(b.group.prompt_ids, [(c.token_ids, c.logprobs) for c in b.group.completions],
                           group_seeds(nonce, b.group.problem_id, b.sampler, len(b.group.completions))) for b in groups]
        positions = sum(len(c.token_ids) for b in groups for c in b.group.completions)
        # the flip rate's measurement, only from what the budget has left (node/audit/budget.py)
        reference = self.cfg.audit.calibrate and self.budget.affords(self.budget.reference_s(len(groups)))
        results = audit_groups(model, items, self.sampling.params, self.pad_id, self.cfg.audit.margin,
                               self.cfg.audit.margin_hard, reference=reference)
        seconds = time.perf_counter() - t0
        self.budget.audited(seconds, len(groups), reference, spot=spot)
        self.stats["time_s"] += seconds
        self.stats["reference_positions"] += positions if reference else 0
        return [self._judge(b, r) for b, r in zip(groups, results)]

    def _judge(self, b: BufferedGroup, result: AuditResult) -> str:
        """Count `result` and set `b`'s verdict; why it failed ("" if it passed)."""
        self.audits[b.sampler] += 1
        st = self.stats
        st["audits"] += 1
        st["positions"] += result.positions
        st["flips"] += result.flips
        st["exceedances"] += result.exceedances
        rate = self.flip_rate.rate(self.cfg.audit.flip_rate) if self.cfg.audit.calibrate else self.cfg.audit.flip_rate
        flipped = self.flip_test.add(b.sampler, result.flips, result.positions, rate)
        exceeded = self.exceed_test.add(b.sampler, result.exceedances, result.positions)
        if result.reference_flips is not None:  # after: the rate is fixed before the group
            self.flip_rate.add(result.reference_flips, result.positions)
        st["flip_rate"] = rate
        if self.measures_claims:
            self.claim_gaps.add(b.sampler, result.claim_k3, result.positions)
        if result.passed and result.logprob_gap <= self.cfg.audit.logprob_gap and not flipped and not exceeded:
            st["logprob_gap_max"] = max(st["logprob_gap_max"], result.logprob_gap)  # passed groups' (exceedances too)
            st["margin_max"] = max(st["margin_max"], result.max_margin)
            b.verdict = Verdict.PASS
            return ""
        st["failed"] += 1
        b.verdict = Verdict.FAILED
        if not result.passed:
            return (f"audit failed: {result.failed_positions} of {result.positions} tokens are not ones its "
                    f"race selects at v{b.claimed_version} for any honest engine (largest margin "
                    f"{result.max_margin:.3g} > {self.cfg.audit.margin_hard:g} logits)")
        if result.logprob_gap > self.cfg.audit.logprob_gap:
            return f"audit failed: claimed log-probs {result.logprob_gap:.3f}/token away from v{b.claimed_version}'s"
        return "; ".join(test.why(b.sampler) for test, hit in ((self.flip_test, flipped), (self.exceed_test, exceeded)) if hit)

    def state_dict(self) -> dict[str, Any]:
        return {"audits": dict(self.audits), "stats": dict(self.stats), "flip_test": self.flip_test.state_dict(),
                "exceed_test": self.exceed_test.state_dict(),
                "flip_rate": self.flip_rate.state_dict(), "claim_gaps": self.claim_gaps.state_dict(),
                "budget": self.budget.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.audits = collections.Counter(state["audits"])
        self.stats = {**NEW_STATS, **state["stats"]}
        self.flip_test.load_state_dict(state.get("flip_test", {}))
        self.exceed_test.load_state_dict(state.get("exceed_test", {}))
        self.flip_rate.load_state_dict(state.get("flip_rate", {}))
        self.claim_gaps.load_state_dict(state.get("claim_gaps", {}))
        self.budget.load_state_dict(state.get("budget", {}))
