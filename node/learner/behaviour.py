"""Behaviour log-probs the learner computes itself (`behaviour_logprobs = "learner"`, or "auto"
for the samplers whose claims sit far: node/audit/claim_gaps.py).

Why: a sampler's engine computes in its own precision and kernels (bfloat16 on a GPU), so even
on-policy its log q of a token differs from the learner's log p at the same weights, and every
loss's ratio p/q carries the engines' difference as if it were policy change. On the built-in
model that is k3 ~1e-4 a token; on a 151k-vocabulary shape in bfloat16, 6% of tokens past GRPO's
clip (docs/BENCHMARKS.md, "The audit across precisions"). Recomputed by the learner's own forward
(its compute dtype, its kernels) at the published weights of the version the group claims, an
on-policy ratio is 1 to rounding and a stale group's ratio measures policy change alone.

What a sampler claims is then checked, and enters the loss only as the rollout correction's weight
p_ours / q_claimed kept within a factor of `rollout_is_cap` (node/training/step.rollout_weight): a
sequence whose claims are further than `max_logprob_gap` from the recomputed ones (the same
version, so honest claims differ by engine rounding only) drops its group from the step, as the
trainer's own check does.

Cost: a no-grad forward of each own-model group on the audit copy of the model, and rebuilding
each version the step's groups claim (node/audit.VersionArchive: a patch from the one before).
A version the learner no longer holds keeps its sampler's claims (counted).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from node.algorithms.base import k3
from node.training.logprobs import completion_logprobs, completion_span, pack
from node.training.batch import ScoredGroup
from node.training.step import StepOptions, plan_microbatches
from node.audit.claim_gaps import ClaimGaps

log = logging.getLogger(__name__)


@torch.no_grad()
def learner_logprobs(model: torch.nn.Module, groups: list[ScoredGroup], temperature: float, pad_id: int,
                     options: StepOptions) -> list[list[list[float]]]:
    """Each group's completions' token log-probs under `model`, computed as a training step
    computes them (`completion_logprobs` at `temperature`, under `options`' autocast and
    micro-batch budget): [group][completion][token]."""
    device = next(model.parameters()).device
    rows = [(g.prompt_ids, c.token_ids) for g in groups for c in g.completions]
    out: list[list[float]] = [[] for _ in rows]
    lengths = [len(p) + len(c) for p, c in rows]
    for part in plan_microbatches(lengths, options.max_tokens_per_microbatch):
        packed = pack([rows[i][0] for i in part], [rows[i][1] for i in part], pad_id).to(device)
        with options.autocast(device):
            logp = completion_logprobs(model, packed, temperature).cpu()
        for r, i in enumerate(part):
            out[i] = logp[r, completion_span(len(rows[i][0]), len(rows[i][1]))].tolist()
    per_group, pos = [], 0
    for g in groups:
        per_group.append(out[pos : pos + len(g.completions)])
        pos += len(g.completions)
    return per_group


def claim_error(claimed: list[float], mine: list[float]) -> torch.Tensor:
    """log q/p of one sequence's tokens, float64 [T]: the claims against the learner's own."""
    return torch.tensor(claimed, dtype=torch.float64) - torch.tensor(mine, dtype=torch.float64)


@dataclass
class Mismatch:
    """How far honest claims (those kept) sit from the recomputed log-probs, over a step's tokens:
    what the sampler's engine would have put into the ratio."""

    tokens: int = 0
    abs_sum: float = 0.0
    k3_sum: float = 0.0
    clipped: int = 0
    """Tokens whose ratio p/q = exp(recomputed - claimed) is outside GRPO's clip [1 - 0.2, 1 + 0.2]."""

    def add(self, d: torch.Tensor) -> None:
        """Count one sequence's `claim_error`."""
        self.tokens += d.numel()
        self.abs_sum += float(d.abs().sum())
        self.k3_sum += float(k3(d).sum())  # as the step's kl_k3 and the guard take it, clamped alike
        self.clipped += int(((-d).exp() - 1).abs().gt(0.2).sum())  # p/q against GRPO's clip

    def merge(self, other: "Mismatch") -> None:
        self.tokens += other.tokens
        self.abs_sum += other.abs_sum
        self.k3_sum += other.k3_sum
        self.clipped += other.clipped

    def stats(self) -> dict[str, float]:
        """The step's figures; none when no claim was compared (nothing recomputed)."""
        if not self.tokens:
            return {}
        n = self.tokens
        return {"behaviour_gap_mean": self.abs_sum / n, "behaviour_k3": self.k3_sum / n,
                "behaviour_clip_share": self.clipped / n}


def with_logprobs(group: ScoredGroup, logprobs: list[list[float]]) -> ScoredGroup:
    """`group` with its completions' behaviour log-probs replaced, the claims kept beside them
    (`claimed_logprobs`: what the rollout correction weighs the sampler's engine by)."""
    comps = [dataclasses.replace(c, logprobs=lp) for c, lp in zip(group.completions, logprobs)]
    return dataclasses.replace(group, completions=comps, claimed_logprobs=[c.logprobs for c in group.completions])


class Recompute:
    """The step's part that puts the learner's log-probs into its own-model groups; it owns the
    time it spends (`time_s`), for the step record."""

    def __init__(self, model_at, temperature: float, pad_id: int, options: StepOptions, max_gap: float,
                 gaps: ClaimGaps, only_far: bool = False, resample: Callable[[str], bool] | None = None) -> None:
        """`model_at((chain, version))`: the audit copy with that version's published weights
        loaded, or None if they cannot be rebuilt (node/audit/auditor.Auditor.model_at).
        `gaps`: where each recomputed group's claim gap is counted, per sampler; with `only_far`
        ("auto"), only the groups of samplers whose claims it finds far (or not measured) are
        recomputed, the others keep their claims, but for those `resample(sampler)` picks (at
        random: what keeps a close sampler's estimate fresh where audits do not measure it)."""
        self.model_at, self.temperature, self.pad_id, self.options, self.max_gap = model_at, temperature, pad_id, options, max_gap
        self.gaps, self.only_far, self.resample = gaps, only_far, resample
        self.time_s = 0.0

    def _wanted(self, sampler: str) -> bool:
        if not self.only_far or self.gaps.far(sampler):
            return True
        return self.resample is not None and self.resample(sampler)

    def __call__(self, taken: list) -> tuple[list, list, dict[str, float]]:
        """`taken` (BufferedGroups) with own-model groups' log-probs recomputed: (what to train on,
        the groups dropped because a claim was further than `max_gap` from ours, the step's figures)."""
        t0 = time.perf_counter()
        by_version: dict[tuple[str, int], list] = {}
        close = 0
        for b in taken:
            if not b.own:
                continue
            if not self._wanted(b.sampler):
                close += 1  # measured close to ours: its claims are as good, and free
                continue
            by_version.setdefault((b.chain, b.claimed_version), []).append(b)
        mismatch, kept, dropped = Mismatch(), 0, set()
        for key, groups in sorted(by_version.items()):
            try:
                model = self.model_at(key)
                ours = None if model is None else learner_logprobs(model, [b.group for b in groups], self.temperature,
                                                                   self.pad_id, self.options)
            except Exception:  # e.g. out of memory: the step goes on with the claims (checked by the trainer)
                log.exception("recomputing the behaviour log-probs of %d groups at %s v%d failed; their "
                              "samplers' claims are used", len(groups), *key)
                ours = None
            if ours is None:
                kept += len(groups)  # weights we no longer hold (or could not run): the sampler's claims stay
                continue
            for b, lps in zip(groups, ours):
                errors = [claim_error(c.logprobs, lp) for c, lp in zip(b.group.completions, lps)]
                one = Mismatch()
                for d in errors:
                    one.add(d)
                self.gaps.add(b.sampler, one.k3_sum, one.tokens)  # dropped or not: the furthest claims count too
                # the trainer's check (node/training/batch.logprob_gap: mean |gap| per token), at the claimed version
                if any(not float(d.abs().mean()) <= self.max_gap for d in errors if d.numel()):
                    dropped.add(id(b))
                    continue
                mismatch.merge(one)
                b.group = with_logprobs(b.group, lps)
        self.time_s += time.perf_counter() - t0
        rec = {**mismatch.stats(), "behaviour_recomputed": sum(map(len, by_version.values())) - kept,
               "behaviour_claims_kept": kept, "behaviour_time_s": round(self.time_s, 3)}
        if self.only_far:
            rec["behaviour_claims_close"] = close
        return [b for b in taken if id(b) not in dropped], [b for b in taken if id(b) in dropped], rec
