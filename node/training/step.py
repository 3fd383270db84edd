"""One optimizer step over a step's routed batches; shared by the local loop and the learner role.

    parts --train_step---> micro-batches under a token budget: forward, loss, backward each
                           (gradients accumulate), then clip, optimizer.step(), metrics

Memory follows the token budget, not the batch: `plan_microbatches` cuts a step into micro-batches
of at most `max_tokens` padded tokens (a group may be split), and every loss takes the whole
batch's normalisers and group statistics (node/algorithms/base.py), so the accumulated gradient
is the full batch's gradient (tests/unit/node/test_trainer.py checks it for every loss). Under FSDP the
micro-batches are dealt out over ranks (`Collective`, node/training/distributed.py).
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch
import xxhash

from node.algorithms import LossInputs
from node.algorithms.base import BatchShape, drift_stats, group_log_e_hat, k3, seq_mean
from node.training.batch import TrainBatch, TrainPart, logprob_gap
from node.training.logprobs import PackedBatch, completion_logprobs

log = logging.getLogger(__name__)


WEIGHTED_METRICS = ("is_weight_mean", "is_weight_var", "clip_frac", "kl_k3", "filtered_frac", "truncated_frac", "drift_frac",
                    "weight_mean_pos", "weight_mean_neg")


class Collective(Protocol):
    """What train_step needs of a process group (node/training/distributed.py implements it over torch.distributed)."""

    rank: int
    world: int

    def all_gather_object(self, obj: Any) -> list[Any]: ...


@dataclass(frozen=True)
class StepOptions:
    """How a step is computed; none of it changes the gradient beyond float rounding, except M2PO's
    (its mask is per micro-batch, as in its released code). The token-level figures (clip_frac,
    is_weight_mean...) are micro-batch means weighted by sequences, so they may move with the cut."""

    max_tokens_per_microbatch: int | None = None
    """Padded tokens (rows x longest row) per forward/backward; None: the whole step at once."""
    autocast_dtype: torch.dtype | None = None
    """Compute dtype of the forward (bfloat16 on GPUs); master weights stay as they are (float32)."""

    def autocast(self, device: torch.device) -> torch.autocast:
        """The forward's autocast context (a no-op without a compute dtype)."""
        return torch.autocast(device.type, self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None)


def plan_microbatches(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Rows into micro-batches of at most `max_tokens` padded tokens (rows x longest row).

    Longest rows first, so rows of similar length share a micro-batch and padding stays small; a
    row longer than the budget gets a micro-batch of its own. Which rows share a micro-batch does
    not change the step (losses use whole-batch normalisers)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if max_tokens is None:
        return [order] if order else []
    plan: list[list[int]] = []
    for i in order:  # lengths fall, so the first row of a micro-batch is its longest
        if plan and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= max_tokens:
            plan[-1].append(i)
        else:
            plan.append([i])
    return plan


@dataclass
class _Work:
    part: int
    rows: list[int]


def _deal(parts: Sequence[TrainPart], max_tokens: int | None, world: int) -> list[list[_Work | None]]:
    """Every part's micro-batches dealt round-robin over `world` ranks, padded with None so that
    every rank runs the same number of forward/backward passes (FSDP's collectives pair up)."""
    work = [_Work(p, rows) for p, part in enumerate(parts)
            for rows in plan_microbatches(part.batch.packed.attention_mask.sum(-1).tolist(), max_tokens)]
    per_rank = [work[r::world] for r in range(world)]
    n = max(len(w) for w in per_rank)
    return [w + [None] * (n - len(w)) for w in per_rank]


def _part_context(part: TrainPart) -> tuple[BatchShape, torch.Tensor]:
    b = part.batch
    rows = getattr(part.cfg, "e_hat_rows", 0)
    e_hat_groups = b.group_ids if not rows else shuffled_blocks(b.old_logp, rows)
    return BatchShape.of(b.packed.completion_mask), group_log_e_hat(b.old_logp, b.packed.completion_mask, e_hat_groups)


def shuffled_blocks(old_logp: torch.Tensor, rows: int) -> torch.Tensor:
    """[B] block ids: the batch's rows shuffled into blocks of `rows` (GEPO's released code takes
    E_hat over such micro-batches, prompts mixed). The shuffle is seeded by the behaviour
    log-probs' bytes, so a run is reproducible and every rank of a step draws the same blocks."""
    n = old_logp.shape[0]
    gen = torch.Generator().manual_seed(xxhash.xxh64_intdigest(old_logp.detach().cpu().numpy().tobytes()) >> 1)
    blocks = torch.empty(n, dtype=torch.long)
    blocks[torch.randperm(n, generator=gen)] = torch.arange(n) // rows
    return blocks


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, parts: Sequence[TrainPart],
               temperature: float, max_grad_norm: float = 1.0, options: StepOptions = StepOptions(),
               dist: Collective | None = None, lr: float | None = None) -> dict[str, Any]:
    """One optimizer step on all `parts`; part p's loss is weighted by its share of the sequences.
    `lr`: this step's learning rate (the divergence guard's, node/training/guard.py); None keeps the optimizer's.

    Sequences that fail their part's log-prob check contribute nothing (the normalisers are the
    whole batch's, so the others' weights do not grow). A non-finite loss or gradient norm skips
    the optimizer step. Returns the diagnostics averaged over parts (sequence-weighted) and per
    part under "routes". With `dist`, every rank calls this with the same parts and does its share.
    """
    rank, world = (dist.rank, dist.world) if dist is not None else (0, 1)
    device = next(model.parameters()).device
    total = sum(int(p.batch.advantages.numel()) for p in parts)
    contexts = [_part_context(p) for p in parts]
    mine = _deal(parts, options.max_tokens_per_microbatch, world)[rank] if parts else []
    optimizer.zero_grad(set_to_none=True)
    model.train()
    acc = _Accumulator(len(parts))
    try:
        for work in mine:
            loss = _microbatch(model, parts, contexts, work, temperature, total, options, device, acc)
            if loss is not None:
                # summed over ranks, not averaged: each rank's loss is its share of the whole step's
                (loss * world).backward()
    finally:
        model.eval()
    routes, ok, kept = acc.result(parts, dist)
    metrics: dict[str, Any] = {k: share_weighted(routes, k) for k in WEIGHTED_METRICS
                               if any(k in r and r.get("share") for r in routes.values())}
    metrics["routes"] = routes
    if not kept:
        log.warning("every sequence of the step failed the log-prob check; optimizer step skipped")
        optimizer.zero_grad(set_to_none=True)
        return {**metrics, "loss": float("nan"), "grad_norm": float("nan"), "step_skipped": 1.0}
    loss_value = sum(r.get("loss", 0.0) * r.get("share", 0.0) for r in routes.values())
    if not ok:
        # NaN/inf input can give a NaN loss with a *finite* gradient (clamp's backward zeroes the
        # NaN path), so the loss is checked: one poisoned batch must not move the weights.
        log.warning("non-finite loss; optimizer step skipped")
        optimizer.zero_grad(set_to_none=True)
        return {**metrics, "loss": float("nan"), "grad_norm": float("nan"), "step_skipped": 1.0}
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
    if not torch.isfinite(grad_norm):
        log.warning("non-finite gradient norm (%s); optimizer step skipped", grad_norm.item())
        optimizer.zero_grad(set_to_none=True)
        return {**metrics, "loss": loss_value, "grad_norm": float("nan"), "step_skipped": 1.0}
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    optimizer.step()
    return {**metrics, "loss": loss_value, "grad_norm": grad_norm.item(), "step_skipped": 0.0}


def share_weighted(routes: dict[str, dict[str, Any]], key: str) -> float:
    """`key` over the routes that report it, each weighted by its share of the step's sequences
    (renormalised over those routes: a figure only the own route has, like `drift_frac`, is that
    route's own figure, not diluted by the foreign route's share)."""
    having = [r for r in routes.values() if key in r and r.get("share")]
    return sum(r[key] * r["share"] for r in having) / sum(r["share"] for r in having)


def _microbatch(model, parts, contexts, work: _Work | None, temperature: float, total: int,
                options: StepOptions, device: torch.device, acc: "_Accumulator") -> torch.Tensor | None:
    """Forward one micro-batch and return its share of the step's loss (None: nothing to backward).

    An idle rank (work None) runs a one-token forward with a zero loss: FSDP's gathers and
    reductions need every rank in every pass."""
    if work is None:
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        batch = PackedBatch(ids, torch.ones_like(ids), torch.ones((1, 1), dtype=torch.bool, device=device))
        with options.autocast(device):
            return completion_logprobs(model, batch, temperature).sum() * 0.0
    part, (whole, log_e_hat) = parts[work.part], contexts[work.part]
    b, rows = part.batch, work.rows
    packed = b.packed.rows(rows).to(device)
    width = packed.completion_mask.shape[1]
    with options.autocast(device):
        logp = completion_logprobs(model, packed, temperature)
    sel = torch.tensor(rows, dtype=torch.long, device="cpu")
    old = b.old_logp[sel, :width].to(device)
    keep = torch.ones(len(rows), dtype=torch.bool, device=device)
    if part.max_logprob_gap is not None:
        gap = logprob_gap(logp, old, packed.completion_mask)
        keep = gap <= part.max_logprob_gap  # NaN claims fail this too
        acc.gaps(work.part, gap, b.group_ids[sel][~keep.cpu()])
        # each kept sequence's divergence from the policy that sampled it: the guard's robust signal
        acc.seq_k3[work.part] += seq_mean(k3(old - logp.detach()), packed.completion_mask)[keep].float().cpu().tolist()
    if not keep.any():
        return logp.sum() * 0.0
    k = keep.nonzero().squeeze(-1)
    kc = k.cpu()
    seq = b.old_seq_logp[sel][kc].to(device) if b.old_seq_logp is not None else None
    log_w, rollout_figures = rollout_weight(b, sel, kc, width, part.rollout_cap, packed.completion_mask[k])
    out = part.algo.loss(LossInputs(logp[k], old[k], b.advantages[sel][kc].to(device), packed.completion_mask[k],
                                    b.group_ids[sel][kc].to(device), seq, whole=whole,
                                    log_e_hat=log_e_hat[sel][kc].to(device), rollout_log_weight=log_w), part.cfg)
    out.metrics.update(rollout_figures)
    if part.max_logprob_gap is not None:  # our model's rollouts: another model's q is far from p by design
        out.metrics.update(drift_stats(logp[k], old[k], packed.completion_mask[k], b.advantages[sel][kc].to(device)))
    share = whole.sequences / total
    loss = share * out.loss
    finite = bool(torch.isfinite(loss))
    acc.add(work.part, out, len(kc), finite)
    return loss if finite else logp.sum() * 0.0


def rollout_weight(b: TrainBatch, sel: torch.Tensor, kc: torch.Tensor, width: int, cap: float | None,
                   mask: torch.Tensor) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The kept rows' log rollout weights log(p_old / q_engine) truncated to within [1 / cap, cap],
    [k, width] on `mask`'s device, and their figures (None and none: off or nothing recomputed).
    Truncated from both sides (verl's lower bound, 1 / upper): claims a sampler forges can raise a
    token's weight to cap, and lower it no further than 1 / cap (muting its own negative-advantage
    tokens)."""
    if cap is None or b.rollout_log_weight is None:
        return None, {}
    raw = b.rollout_log_weight[sel, :width][kc].to(mask.device)
    rows = (b.recomputed[sel][kc] if b.recomputed is not None else torch.ones(len(kc), dtype=torch.bool)).to(mask.device)
    return raw.clamp(-math.log(cap), math.log(cap)), rollout_stats(raw[rows], mask[rows], cap)


ROLLOUT_FIGURES = ("rollout_weight_mean", "rollout_truncated_frac")
"""Means over the recomputed sequences alone (`rollout_sequences` of them), not over the route's."""


def rollout_stats(log_w: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """Over the recomputed sequences given: per sequence, its tokens' mean truncated rollout weight
    and share truncated (at cap or 1 / cap); each a mean over the sequences, with their count
    (`rollout_sequences`) to weigh it by, so the figure is the same however the step is cut into
    micro-batches. Per route only: a step-level mean would count the routes without weights as 0."""
    m = mask.bool()
    if not m.any():
        return {}
    lw, bound = log_w.double(), math.log(cap)
    return {"rollout_weight_mean": seq_mean(lw.clamp(-bound, bound).exp(), m).mean().item(),
            "rollout_truncated_frac": seq_mean((lw.abs() > bound).double(), m).mean().item(),
            "rollout_sequences": float(len(m))}


class _Accumulator:
    """Per-part sums over this rank's micro-batches, merged over ranks at the end of the step."""

    def __init__(self, n_parts: int) -> None:
        self.loss = [0.0] * n_parts  # the part's loss: micro-batch losses sum to it (shared normalisers)
        self.seqs = [0] * n_parts
        self.metric_sums: list[dict[str, float]] = [{} for _ in range(n_parts)]  # sequence-weighted
        self.gap_sum, self.gap_n, self.gap_max = [0.0] * n_parts, [0] * n_parts, [float("-inf")] * n_parts
        self.dropped: list[set[int]] = [set() for _ in range(n_parts)]
        self.seq_k3: list[list[float]] = [[] for _ in range(n_parts)]
        """Per kept sequence of a checked part: mean k3 per token (`kl_k3_median` of its route)."""
        self.finite = True

    def gaps(self, p: int, gap: torch.Tensor, dropped_groups: torch.Tensor) -> None:
        g = gap.detach().float().cpu()
        self.gap_sum[p] += float(g.nan_to_num(nan=float("inf")).sum())
        self.gap_n[p] += g.numel()
        self.gap_max[p] = max(self.gap_max[p], float(g.nan_to_num(nan=float("inf")).max()))
        self.dropped[p] |= {int(i) for i in dropped_groups}

    def add(self, p: int, out, n: int, finite: bool) -> None:
        self.finite &= finite
        self.loss[p] += out.loss.item() if finite else 0.0
        self.seqs[p] += n
        for k, v in out.metrics.items():
            # a count is summed; the rollout figures weigh by their own sequences; the rest by the micro-batch's
            w = 1 if k == "rollout_sequences" else out.metrics["rollout_sequences"] if k in ROLLOUT_FIGURES else n
            self.metric_sums[p][k] = self.metric_sums[p].get(k, 0.0) + v * w

    def result(self, parts: Sequence[TrainPart], dist: Collective | None) -> tuple[dict[str, dict], bool, int]:
        mine = [self.loss, self.seqs, self.metric_sums, self.gap_sum, self.gap_n, self.gap_max, self.dropped, self.finite,
                self.seq_k3]
        everyone = dist.all_gather_object(mine) if dist is not None else [mine]
        routes: dict[str, dict[str, Any]] = {}
        total = sum(int(p.batch.advantages.numel()) for p in parts)
        for i, part in enumerate(parts):
            seqs = sum(e[1][i] for e in everyone)
            r: dict[str, Any] = {}
            if part.max_logprob_gap is not None:
                n = sum(e[4][i] for e in everyone)
                r.update(logprob_gap_mean=sum(e[3][i] for e in everyone) / max(n, 1),
                         logprob_gap_max=max(e[5][i] for e in everyone),
                         dropped_groups=sorted(set().union(*(e[6][i] for e in everyone))))
                k3s = [x for e in everyone for x in e[8][i]]
                if k3s:  # the median sequence's: a few sequences (one sampler's forged claims) cannot move it
                    r["kl_k3_median"] = statistics.median(k3s)
            if seqs:
                sums: dict[str, float] = {}
                for e in everyone:
                    for k, v in e[2][i].items():
                        sums[k] = sums.get(k, 0.0) + v
                share = int(part.batch.advantages.numel()) / total
                # the part's loss on its own scale (per its whole batch), as a single-batch step reports it
                per = {k: v if k == "rollout_sequences" else v / sums["rollout_sequences"] if k in ROLLOUT_FIGURES
                       else v / seqs for k, v in sums.items()}
                r.update(per, loss=sum(e[0][i] for e in everyone), sequences=seqs, share=share)
            if r:
                routes[part.name] = r
        return routes, all(e[7] for e in everyone), sum(sum(e[1]) for e in everyone)
