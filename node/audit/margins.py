"""An audit of checkable sampling (node/sampling/race.py): does every token of a group win its race?

    results = audit_groups(model_v, items, params, pad_id, tol, hard)   # one forward pass for v's groups

On the weights the sampler held at version v (rebuilt by archive.py), the auditor recomputes each
position's race and measures by how much the claimed token won or lost it (its *margin*, in
logits): an honest engine in another precision or with other kernels loses a race only by its
rounding, nearly always within `tol`; a chosen token may lose by far more. Rounding has a tail
(honest bfloat16 samplers fell 2.36 logits short on a trained tiny model), so a margin past
`tol` is an *exceedance*, counted against the sampler by a sequential test (flips.py, in
auditor.py); only one past `hard`, which no honest engine's rounding reaches, fails the group.
What a failed group costs is the Auditor's (auditor.py): the sampler is refused for good
(refusals.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from node.algorithms.base import k3
from node.sampling.race import keys_tensor, pick_tokens, position_keys, race_margins, within_tolerance
from node.sampling.params import SamplingParams
from node.training.logprobs import completion_logits, logprobs_from_logits, pack

log = logging.getLogger(__name__)


FLIP_MARGIN = 1e-3
"""A position whose margin exceeds this (logits) counts as a flip: the sampler's token is not the
one the auditor's race selects. Float32 engines differ by ~1e-5 (other kernels, other batch
shapes), far below it; bfloat16 and float16 engines flip near-ties (examples/bench_bf16_audit.py)."""


@dataclass
class AuditResult:
    passed: bool
    """Every position's margin within the hard bound (AuditConfig.margin_hard)."""
    positions: int
    failed_positions: int
    logprob_gap: float
    """Mean |claimed - recomputed| behaviour log-prob at the claimed version (engine numerics)."""
    flips: int = 0
    """Positions whose margin exceeds FLIP_MARGIN (the per-sampler statistic's events)."""
    max_margin: float = 0.0
    """The largest margin (inf for a token that no honest engine's filters keep)."""
    exceedances: int = 0
    """Positions whose margin is past the tolerance but within the hard bound (AuditConfig.margin,
    margin_hard): the exceedance test's events."""
    reference_flips: int | None = None
    """Positions at which the auditor's own REFERENCE_DTYPE engine flipped (None: not run)."""
    claim_k3: float = 0.0
    """k3 of log q/p summed over the positions: the claims against the recomputed log-probs, as
    node/learner/behaviour.Mismatch takes it (node/audit/claim_gaps.py)."""


@dataclass
class AuditItem:
    """One group to audit: its prompt, its completions (tokens, claimed log-probs), their seeds."""

    prompt_ids: list[int]
    completions: list[tuple[list[int], list[float]]]
    seeds: list[bytes]


REFERENCE_DTYPE = torch.bfloat16
"""The precision the auditor measures honest flips in, beside its float32 audit: the lowest that
samplers run by default, and the one that flips most (docs/BENCHMARKS.md)."""


def margins_at(logits: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, p: SamplingParams, slack: float,
               hard: float | None = None) -> torch.Tensor:
    """node/sampling/race.race_margins with top-k / top-p applied with `slack` of slack; a token
    they drop (inf) that an engine within `hard` could have let through: its margin with the
    filters applied with `hard` of slack, and at least `hard` (see audit_margins)."""
    margins = race_margins(logits, tokens, keys, p.temperature, p.top_k, p.top_p, slack)
    if hard is None or hard <= slack or not bool((dropped := margins.isinf()).any()):  # the usual case: one sync
        return margins
    rows = dropped.nonzero().flatten()
    wide = race_margins(logits[rows], tokens[rows], keys[rows], p.temperature, p.top_k, p.top_p, hard)
    # at least `hard` (past the tolerance); more where even the tokens every engine within `hard`
    # keeps beat it by more (no honest engine drew it: a failure); inf stays inf
    margins[rows] = wide.clamp(min=hard)
    return margins


@torch.no_grad()
def audit_margins(model: torch.nn.Module, items: list[AuditItem], params: SamplingParams, pad_id: int,
                  reference: bool = False, slack: float = 0.0,
                  hard: float | None = None) -> list[tuple[torch.Tensor, float, int | None, float]]:
    """Per group: every completion position's race margin (node/sampling/race.race_margins: logits,
    float64 on the CPU, rows in order) under `model` (the weights of the version the groups
    claim), the mean |claimed - recomputed| behaviour log-prob per completion, and, with
    `reference`, the positions at which an honest engine in REFERENCE_DTYPE would flip: a second
    forward pass under autocast on the same prefixes, whose race pick is scored by the float32
    margins (None without `reference`), and the k3 of log q/p (claimed against recomputed) summed
    over the group's positions. One forward pass (two with `reference`) for all groups.
    `slack`: the tolerance top-k / top-p are applied with (node/sampling/race.race_margins).
    `hard` (> slack): a token those filters drop (margin inf) that an engine within `hard` could
    have let through gets margin `hard` (past the tolerance, not past the hard bound) unless the
    tokens every such engine keeps beat it by more (then that margin, a failure), since an
    honest engine's rounding at a filter's edge can reach past `slack` as it can anywhere. Not the
    filters' slack itself: the wider it is, the fewer tokens every engine surely keeps, and the
    fewer competitors a token's margin is measured against (a slack of 30 logits measured no
    flip in 37k positions of a bfloat16 engine that flips at 0.1%)."""
    rows = [(it.prompt_ids, toks, claimed, seed) for it in items for (toks, claimed), seed in zip(it.completions, it.seeds)]
    device = next(model.parameters()).device
    batch = pack([r[0] for r in rows], [r[1] for r in rows], pad_id).to(device)
    # every completion position in row-major order (the order of completion_mask and of the rows)
    tokens = torch.tensor([t for r in rows for t in r[1]], dtype=torch.long, device=device)
    keys = keys_tensor([k for r in rows for k in position_keys(r[3], len(r[1]))], device)
    claimed = torch.tensor([c for r in rows for c in r[2]], dtype=torch.float32, device=device)
    p = params
    low = None  # the reference engine's picks, scored by the float32 pass below
    if reference:
        low = torch.zeros_like(tokens)
        with torch.autocast(device.type, dtype=REFERENCE_DTYPE):
            for sl, logits in completion_logits(model, batch):
                low[sl] = pick_tokens(logits, keys[sl], p.temperature, p.top_k, p.top_p)
    margins, mine = torch.zeros(len(tokens), dtype=torch.float64, device=device), torch.zeros_like(claimed)
    flipped = torch.zeros(len(tokens), dtype=torch.bool, device=device)
    for sl, logits in completion_logits(model, batch):  # whole distributions, chunk by chunk
        margins[sl] = margins_at(logits, tokens[sl], keys[sl], p, slack, hard)
        mine[sl] = logprobs_from_logits(logits, tokens[sl], p.logprob_temperature)
        if low is not None:
            flipped[sl] = race_margins(logits, low[sl], keys[sl], p.temperature, p.top_k, p.top_p, slack) > FLIP_MARGIN
    sizes = [len(r[1]) for r in rows]
    lengths = torch.tensor(sizes, device=device)
    row_of = torch.repeat_interleave(torch.arange(len(rows), device=device), lengths)
    gap = torch.zeros(len(rows), device=device).index_add_(0, row_of, (mine - claimed).abs()) / lengths.clamp(min=1)
    claim_k3 = k3((claimed - mine).double())
    margins, gap, flipped, claim_k3 = margins.cpu(), gap.tolist(), flipped.cpu(), claim_k3.cpu()  # one transfer each
    out, row, pos = [], 0, 0
    for it in items:
        n = len(it.completions)
        size = sum(sizes[row : row + n])  # host-side: no device sync per group
        ref = int(flipped[pos : pos + size].sum()) if low is not None else None
        out.append((margins[pos : pos + size], sum(gap[row : row + n]) / max(n, 1), ref,
                    float(claim_k3[pos : pos + size].sum())))
        row, pos = row + n, pos + size
    return out


def judge_margins(margins: torch.Tensor, gap: float, tol: float, hard: float | None = None,
                  reference_flips: int | None = None, claim_k3: float = 0.0) -> AuditResult:
    """A group's result from its positions' margins: it passes if every margin is <= `hard`; those
    in (`tol`, `hard`] are its exceedances. `hard` None: `tol` (every exceedance fails the group)."""
    hard = tol if hard is None else hard
    bad = int((~within_tolerance(margins, hard)).sum())
    exceed = int((~within_tolerance(margins, tol)).sum()) - bad
    top = float(margins.max()) if len(margins) else 0.0
    return AuditResult(bad == 0, len(margins), bad, gap, int((margins > FLIP_MARGIN).sum()), top, exceed,
                       reference_flips, claim_k3)


def audit_groups(model: torch.nn.Module, items: list[AuditItem], params: SamplingParams, pad_id: int,
                 tol: float, hard: float | None = None, reference: bool = False) -> list[AuditResult]:
    """Check that each completion's tokens are those its seeded race selects under `model` (the
    weights of the version the groups claim): margins past `tol` logits counted, past `hard` failed
    (`judge_margins`); top-k / top-p applied with `tol` of slack, a token only an engine within
    `hard` could have let through counted as past `tol` (`audit_margins`). One forward
    pass over all the groups' rows (and one in REFERENCE_DTYPE with `reference`)."""
    hard = tol if hard is None else hard
    return [judge_margins(margins, gap, tol, hard, ref, k)
            for margins, gap, ref, k in audit_margins(model, items, params, pad_id, reference, slack=tol, hard=hard)]


def audit_group(model: torch.nn.Module, prompt_ids: list[int], completions: list[tuple[list[int], list[float]]],
                seeds: list[bytes], params: SamplingParams, pad_id: int, tol: float,
                hard: float | None = None) -> AuditResult:
    """`audit_groups` for one group."""
    return audit_groups(model, [AuditItem(prompt_ids, completions, seeds)], params, pad_id, tol, hard)[0]
