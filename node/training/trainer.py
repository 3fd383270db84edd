"""One optimizer step on the groups the learner took: one batch per route, each corrected by its
route's loss (node/algorithms), and the divergence guard (node/training/guard.py) on the next step's lr.

`Training` owns the optimizer (or, for an FSDP2 learner, the `Leader` that drives the ranks'
sharded optimizers), the guard's lr scale, and per-sampler counts of groups the log-prob check
dropped from a step.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import torch

from node.algorithms import get_algorithm
from node.training.guard import guard_scale
from node.training.step import StepOptions, train_step
from node.training.batch import TrainPart, build_batch
from node.learner.config import LearnerConfig
from node.learner.groups import BufferedGroup, Route

log = logging.getLogger(__name__)


class Training:
    def __init__(self, cfg: LearnerConfig, model: torch.nn.Module, temperature: float, pad_id: int,
                 compute_dtype: torch.dtype | None = None, leader=None) -> None:
        """`leader` (node.training.distributed.Leader): the ranks train the sharded copy together and
        `model` is the unsharded copy their gathered weights are loaded into after every step."""
        self.cfg, self.model, self.temperature, self.pad_id, self.leader = cfg, model, temperature, pad_id, leader
        if cfg.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.options = StepOptions(cfg.max_tokens_per_microbatch or None, compute_dtype)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.losses = {Route.OWN: (cfg.own_loss, cfg.own_options), Route.FOREIGN: (cfg.foreign_loss, cfg.foreign_options),
                       Route.FOREIGN_SEQ: (cfg.foreign_loss, cfg.foreign_options)}
        """Each route's loss and its options."""
        self.lr_scale = 1.0
        """The divergence guard's scale on `cfg.lr` for the next step (node/training/guard.py)."""
        self.gap_drops: collections.Counter[str] = collections.Counter()
        """Groups dropped from a step by the log-prob check, per sampler."""
        self.time_s = 0.0
        """Seconds spent in optimizer steps (forward, backward, update): what audits are measured against."""

    @property
    def lr(self) -> float:
        return self.cfg.lr * (self.lr_scale if self.cfg.guard.enabled else 1.0)  # (a checkpoint's scale, if off)

    def parts(self, taken: list[BufferedGroup]) -> tuple[list[TrainPart], int]:
        """One batch per route, with its loss; and how many groups carried no signal (skipped)."""
        parts, skipped = [], 0
        for route in Route:
            groups = [b.group for b in taken if b.route is route]
            if not groups:
                continue
            name, options = self.losses[route]
            algo = get_algorithm(name)
            cfg = algo.make_config(options)
            batch = build_batch(groups, cfg.normalize_std, self.pad_id, getattr(cfg, "keep_zero_variance", False))
            skipped += len(groups) if batch is None else batch.groups_skipped
            if batch is not None:
                # claimed log-probs are checkable only for our own model (another model's differ by
                # design; F-TIS caps their weight instead)
                gap = self.cfg.behaviour.max_logprob_gap if route is Route.OWN else None
                cap = self.cfg.behaviour.rollout_is_cap if route is Route.OWN and self.cfg.behaviour.rollout_is_cap else None
                parts.append(TrainPart(route.value, batch, algo, cfg, gap, cap))
        return parts, skipped

    def train(self, parts: list[TrainPart], rec: dict[str, Any]) -> None:
        """The step on `parts` (none: nothing to train, only the guard's record); its figures into `rec`."""
        t0 = time.perf_counter()
        if parts:
            rec.update(self._step(parts))
        self._guard(rec)
        self.time_s += time.perf_counter() - t0

    def _step(self, parts: list[TrainPart]) -> dict[str, Any]:
        if self.leader is None:
            rec = train_step(self.model, self.optimizer, parts, self.temperature, self.cfg.max_grad_norm,
                             self.options, lr=self.lr)
            # not held between steps: 4 bytes a parameter while the learner publishes and audits
            self.optimizer.zero_grad(set_to_none=True)
            return rec
        rec = self.leader.step(parts, self.temperature, self.cfg.max_grad_norm, self.options, lr=self.lr)
        self.model.load_state_dict(self.leader.state_dict())  # the gathered weights: what we publish
        return rec

    def _guard(self, rec: dict[str, Any]) -> None:
        """Record this step's lr and move the scale for the next one from its k3 (node/training/guard.py)."""
        rec["lr"] = self.lr
        if rec.get("step_skipped"):  # nothing moved: nothing measured
            rec["guard_kl"], rec["guard_lr_scale"] = float("nan"), self.lr_scale
            return
        # own-model rollouts only (another model's log-probs differ by design), and their median
        # sequence: a sampler's forged claims (within the gap check) cannot slow the learner down
        kl = rec.get("routes", {}).get(Route.OWN.value, {}).get("kl_k3_median", float("nan"))
        before, self.lr_scale = self.lr_scale, guard_scale(self.lr_scale, kl, self.cfg.guard)
        rec["guard_kl"], rec["guard_lr_scale"] = kl, self.lr_scale
        if self.lr_scale < before:
            log.info("divergence guard: median k3 %.3f > %.3f, next lr x%.3f", kl, self.cfg.guard.kl_high, self.lr_scale)

    def mark_gap_drops(self, taken: list[BufferedGroup], rec: dict[str, Any]) -> int:
        """Mark the taken own-model groups the step's log-prob check dropped a sequence of (they earn
        no credit); counted per sampler; returns how many."""
        own = [b for b in taken if b.own]
        for i in rec.get("routes", {}).get(Route.OWN.value, {}).get("dropped_groups", []):
            self.gap_drop(own[i])
        return sum(b.gap_dropped for b in own)

    def gap_drop(self, b: BufferedGroup) -> None:
        """`b` was dropped from a step for its claimed log-probs (here, or by the learner's
        recomputation): no credit, counted against its sampler."""
        b.gap_dropped = True
        self.gap_drops[b.sampler] += 1
        log.warning("group from %s (v%d): claimed log-probs too far from ours; dropped from the step",
                    b.sampler, b.claimed_version)

    def abandon(self) -> None:
        """A step failed (e.g. out of memory): leave nothing of it behind."""
        self.model.eval()
        self.optimizer.zero_grad(set_to_none=True)

    def optimizer_state(self) -> dict[str, Any]:
        return self.leader.optimizer_state() if self.leader else self.optimizer.state_dict()

    def load_optimizer_state(self, model_state: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
        if self.leader is not None:
            self.leader.load(model_state, state)
        else:
            self.optimizer.load_state_dict(state)

    def state_dict(self) -> dict[str, Any]:
        return {"lr_scale": self.lr_scale, "gap_drops": dict(self.gap_drops)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr_scale = float(state["lr_scale"])
        self.gap_drops = collections.Counter(state["gap_drops"])
