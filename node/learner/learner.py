"""The learner: checks records, buffers groups, audits, trains and publishes, one part each.

Invariants (what makes off-policy training here correct):
  * every accepted group carries the policy version that generated it, and its staleness is
    `learner.version - group.version` at the moment it is trained on;
  * a group older than `max_staleness` versions is never trained on (dropped and counted, at
    ingest and again at batch time, since it may age in the buffer);
  * rewards are recomputed from the completion text with the task's verifier; the sampler's
    claimed reward is only compared (`reward_claim_mismatch`), never used;
  * a record is validated completely before it is accepted, and once accepted it is kept (in
    the buffer and in checkpoints) until trained on or dropped as stale, never lost.

Routing (docs/DESIGN.md, "The algorithms"): rollouts of the learner's own model go to `own_loss`
(`gepo_lenclip` by default), rollouts of another model to `foreign_loss` (F-TIS by default); either may be
"drop". A foreign model with another tokenizer is re-tokenized and corrected at sequence level.

The parts, each owning its state and its `state_dict`: `RecordChecks` (and `Chains`), the
`GroupBuffer`, the `Auditor`, `Training` (with the guard), `Publishing`, the `Books`; and, with
`behaviour_logprobs = "learner"` (or "auto"), `Recompute` (stateless but for its time), which puts the
learner's own log-probs into own-model groups (in "auto", those of samplers whose claims were
measured far, or not yet: node/audit/claim_gaps.py) on the audit copy between a step's audits and its training. The learner
is the rollout receiver's `Intake` (swarm/exchange.py): the network thread asks it about each
record before acknowledging it.
"""

from __future__ import annotations

import collections
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import torch

from swarm.exchange import LearnerLink, Received
from swarm.wire.rollout import RecordError, RolloutGroup, decode_rollout_group

from node.audit.refusals import RefusalList
from node.audit.archive import VersionArchive
from node.sampling.params import SamplingConfig
from node.engines.hf import HFEngine
from node.learner.evaluate import eval_problems, evaluate
from node.metrics import Kind, Metric, MetricsWriter
from node.models import without_dropout
from node.tasks import Task
from node.tasks.bounded import group_budget_s
from node.weights.blob import untie
from node.algorithms import has_signal
from node.audit.auditor import Auditor
from node.learner.phases import Phases
from node.learner.behaviour import Recompute
from node.learner.books import Books
from node.learner.buffer import GroupBuffer, within_share
from node.learner.intake import Chains, RecordChecks
from node.learner.config import DROP, LearnerConfig
from node.learner.groups import BufferedGroup, Route
from node.learner.checkpoint import (FORMAT, load_checkpoint, load_learner_state, losses_of, rng_state, save_checkpoint,
                                     say_if_losses_differ)
from node.weights.publishing import Publishing
from node.learner.report import batch_stats, counters
from node.learner.scoring import REWARD_BUDGET, OverBudget, score_group
from node.learner.scoring_time import BURST_GROUPS, SCORING_TIME, ScoringTime
from node.training.trainer import Training
from swarm.wire.reasons import Busy, Drop

log = logging.getLogger(__name__)


KEEP_RECORDS = 1024
"""Step and eval records a node's learner keeps in memory (its status line; the tally's latest eval,
at eval_every <= 1024): ~8.6 KiB each in Python, so a learner that kept them all grew by ~33 MB/h
at the demo's 63 versions a minute (a 100-minute soak: +41 MB/h fitted, issue 39)."""


class Learner:
    def __init__(self, cfg: LearnerConfig, model, tokenizer, task: Task, *, model_id: str,
                 sampling: SamplingConfig = SamplingConfig(), swarm: str = "local", link: LearnerLink | None = None,
                 peer_id: str = "learner", checkpoint_dir: str | Path | None = None,
                 metrics: MetricsWriter | None = None, chain: str | None = None,
                 compute_dtype: torch.dtype | None = None, leader=None,
                 quarantine: Callable[[bytes, str], None] = lambda raw, why: None,
                 checkpoint_extra: Callable[[], dict] = dict, on_record: Callable[[dict], None] | None = None,
                 step_extra: Callable[[], dict] = dict, keep_records: int | None = KEEP_RECORDS,
                 base_weights: Callable[[], dict[str, torch.Tensor]] | None = None) -> None:
        """`model` sits on the device it trains on, in float32 (master weights); `compute_dtype`
        (e.g. bfloat16 on a GPU) is what its forward runs in, under autocast (with a `leader`, the
        ranks' FSDP param_dtype: then only the recomputed behaviour log-probs autocast to it).

        `leader` (node.training.distributed.Leader): this is rank 0 of an FSDP2 learner. The ranks train
        the sharded copy together; `model` is then an unsharded copy that the gathered weights
        are loaded into after every step, for evaluation, audits and publishing.

        `quarantine(raw, why)`: where a record that broke ingest or a step goes (never replayed).
        `checkpoint_extra()`: the runner's state saved with each checkpoint (the swarm's journal
        cursor), found again in `restored_extra`. `on_record(rec)`: each step's and eval's metrics.
        `step_extra()`: what the runner adds to each step record (its doors' refusals, say).
        `keep_records`: step and eval records kept in `history` (None: all, for a finite run).
        `base_weights()`: loads `model`'s starting weights again (from its folder), for audits of
        samplers that hold no version yet; None: the archive keeps a float32 copy of them."""
        # (no dropout: the training forward must be the policy the samplers ran; node/models.without_dropout)
        self.cfg, self.model, self.tok, self.task = cfg, without_dropout(model).eval(), tokenizer, task
        self.model_id, self.sampling, self.swarm, self.peer_id, self.leader = model_id, sampling, swarm, peer_id, leader
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.metrics, self.quarantine, self.checkpoint_extra, self.on_record = metrics, quarantine, checkpoint_extra, on_record
        self.step_extra = step_extra
        self.version = 0
        # log-probs at the sampling temperature (1 for greedy: a 0 would divide the logits by 0), as
        # samplers and audits take them (SamplingConfig.logprob_temperature)
        self.training = Training(cfg, self.model, sampling.params.logprob_temperature, tokenizer.pad_token_id,
                                 None if leader else compute_dtype, leader)  # FSDP: the ranks' param_dtype
        self.engine = HFEngine(self.model, tokenizer, model_id)  # for evaluation only
        # a random chain id by default; a fixed one (the simulator's) makes sampling reproducible,
        # since the versions' nonces (node/sampling/race.py) hash the published bytes, the chain among them
        self.chains = Chains(chain or uuid.uuid4().hex[:12])
        weights, aliases = untie(self.model.state_dict())
        archive = VersionArchive(cfg.max_staleness + 1)
        """Our published versions, rebuilt for audits (node/audit/margins.py); the base model as ("", 0)."""
        archive.put_base(weights, load=base_weights)
        refusals = RefusalList(self.checkpoint_dir / "refused.jsonl" if self.checkpoint_dir else None)
        self.publishing = Publishing(cfg.weights, self.model, model_id, self.chains.this, archive, link)
        self.checks = RecordChecks(cfg, tokenizer, task, sampling, model_id=model_id, swarm=swarm,
                                   chains=self.chains, archive=archive, refusals=refusals)
        # the audit's float32 forward measures the claims' gap only where p is float32 too
        in_float32 = compute_dtype in (None, torch.float32)
        self.auditor = Auditor(cfg, self.model, aliases, sampling, tokenizer.pad_token_id, archive, refusals, peer_id,
                               measures_claims=in_float32)
        self.recompute = (Recompute(self.auditor.model_at, sampling.params.logprob_temperature, tokenizer.pad_token_id,
                                    # the trainer's micro-batches, in the compute dtype even with FSDP
                                    replace(self.training.options, autocast_dtype=compute_dtype),
                                    cfg.behaviour.max_logprob_gap, self.auditor.claim_gaps,
                                    only_far=cfg.behaviour.source == "auto",
                                    resample=None if in_float32 else self.auditor.draw)
                          if cfg.behaviour.source != "sampler" else None)
        """Puts the learner's own log-probs into own-model groups (`behaviour_logprobs`)."""
        self.buffer = GroupBuffer(cfg)
        self._said_only_foreign = False  # the line that says why a learner of partners' groups alone waits
        self.books = Books()
        self.phases = Phases()
        """Where this learner's time goes (node/learner/phases.py): `phase_s` in every step record."""
        self.scoring_time = ScoringTime(BURST_GROUPS * group_budget_s(sampling.group_size))
        """Seconds of scoring per proven key and for all unproven keys (node/learner/scoring_time.py)."""
        self.eval_set = eval_problems(task, cfg.eval_size)
        self.history: collections.deque[dict] = collections.deque(maxlen=keep_records)
        """The newest step and eval records (all of them are in metrics.jsonl)."""
        self.restored_extra: dict = {}
        self._t0 = time.time()

    @property
    def chain(self) -> str:
        """This run's version chain: deltas apply only to weights of the same chain."""
        return self.chains.this

    @property
    def drops(self):
        return self.books.drops

    @property
    def credit(self):
        return self.books.credit

    @property
    def refusals(self) -> RefusalList:
        return self.auditor.refusals

    # ---- the Intake (swarm/exchange.py): asked from the network thread --------------------------
    def check(self, group: RolloutGroup) -> Drop | None:
        """The checks of `ingest` without accepting: the receiver runs them before it acknowledges a
        record, so a refused record never reaches the journal. Never raises."""
        try:
            return self.checks.check(group, self.version, self.publishing.published)
        except Exception:
            log.exception("checking a rollout record failed")
            return Drop.INTERNAL_ERROR

    def untrained(self, sampler: str) -> int:
        """Groups of `sampler` accepted and not yet trained on (its share of the buffer)."""
        return self.buffer.untrained(sampler)

    def is_proven(self, peer: str) -> bool:
        """Whether `peer` passed its first `audit_first` audits and was never refused: until then
        the receiver counts its records against one budget shared by all such keys."""
        return self.auditor.is_proven(peer)

    def is_refused(self, peer: str) -> bool:
        return peer in self.auditor.refusals

    def count_rejected(self, reason: Drop, n: int = 1) -> None:
        self.books.drop(reason, n)

    def count_busy(self, why: Busy, n: int = 1) -> None:
        self.books.throttle(why, n)

    # ---- ingest ----------------------------------------------------------------------------------
    def ingest(self, data: bytes, decoded: RolloutGroup | None = None) -> Drop | None:
        """Validate and accept one record (`decoded`: as the receiver decoded it, else decoded here);
        returns None if accepted, else the drop reason. The checks run again whatever the receiver
        found: the learner may have moved on since (its version, the groups it holds)."""
        group = decoded
        try:
            group = group if group is not None else decode_rollout_group(data)
            reason = self.checks.check(group, self.version, self.publishing.published)
            if reason is None:
                reason = self._accept(group, data)
        except RecordError as e:
            reason = e.reason
            log.warning("rejected a rollout record: %s", e)
        except Exception as e:  # a record must never crash the learner, now or when the journal replays
            reason = Drop.QUARANTINED
            log.exception("a rollout record broke ingest; quarantined")
            self.quarantine(data, f"ingest: {type(e).__name__}: {e}")
        if reason is not None:
            self.books.drop(reason)
            if group is not None:
                log.info("dropped group %s from %s (v%d): %s", group.id[:8], group.sampler, group.version, reason)
        return reason

    def ingest_many(self, records: list[Received | bytes]) -> int:
        with self.phases("intake"):
            return self._ingest_many(records)

    def _ingest_many(self, records: list[Received | bytes]) -> int:
        """Ingest each (as the link received it, or raw bytes); how many were accepted."""
        return sum((self.ingest(*r) if isinstance(r, Received) else self.ingest(r)) is None for r in records)

    def ingest_own(self, group: RolloutGroup, raw: bytes | None = None) -> Drop | None:
        """Accept a group this process's own sampler made with this learner's weights, in memory
        (`join --role sampler,learner`): none of a peer's checks apply (there is no peer), it is not
        audited (same weights, same process) and it earns no credit on our own tally (the
        leaderboard refuses a learner that credits itself). The buffer's bounds still hold. `raw`: the
        group's encoding, when the caller has it already. A refusal is counted."""
        reason = self._accept(group, raw if raw is not None else group.encode())
        if reason is not None:
            self.books.drop(reason)
        return reason

    def _accept(self, g: RolloutGroup, raw: bytes, count: bool = True) -> Drop | None:
        own = self.checks.checked_as_own(g)
        route = Route.OWN if own else (Route.FOREIGN if g.tokenizer == self.checks.tokenizer_id else Route.FOREIGN_SEQ)
        if self.training.losses[route][0] == DROP:
            return Drop.OWN_DROPPED if own else Drop.FOREIGN_DROPPED
        if count and self.buffer.full:
            return Drop.BUFFER_FULL
        proven = self.auditor.is_proven(g.sampler)
        if count and not self.scoring_time.allows(g.sampler, proven):
            return SCORING_TIME  # its key's (or the unproven keys') share of the thread is spent
        t0 = time.monotonic()
        try:
            scored = score_group(g, route, self.task, self.tok, self.version)
        except OverBudget as e:  # its text would cost more to score than honest answers ever do
            log.warning("group %s from %s: %s", g.id[:8], g.sampler, e)
            return REWARD_BUDGET
        finally:
            self.scoring_time.charge(g.sampler, proven, time.monotonic() - t0)
        self.buffer.append(BufferedGroup(scored.group, route, g.sampler, raw, g.chain, g.version))
        self.checks.remember(g)
        if count:
            self.books.version_clamped += scored.clamped
            self.books.reward_claim_mismatch += scored.claim_mismatches
        return None

    # ---- a step ----------------------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether a step can be taken now (`GroupBuffer.ready`), once aged groups are dropped."""
        return self._admitted() is not None

    def _admitted(self) -> int | None:
        """How many new keys' groups the next step may take (`Auditor.admissions`) if a step can be
        taken now, once aged groups are dropped; None if not."""
        if aged := self.buffer.drop_aged(self.version):
            self.books.drop(Drop.STALE, aged)
        new = self.auditor.admissions(self.buffer)
        if unpaired := self.buffer.drop_unpaired(self.auditor.kind_of, self.auditor.is_proven, new):
            self.books.drop(Drop.FOREIGN_UNPAIRED, unpaired)
        if self.buffer.only_foreign(self.auditor.kind_of) and not self._said_only_foreign:
            self._said_only_foreign = True
            log.info("only other models' groups wait (%d): they fill at most %.0f%% of a step "
                     "(learner.foreign.step_share), so the learner steps once its own model's groups arrive",
                     len(self.buffer), 100 * self.cfg.foreign.step_share)
        return new if self.buffer.ready(self.auditor.kind_of, self.auditor.is_proven, new) else None

    def step(self) -> dict | None:
        """One optimizer step on the next `groups_per_step` groups; None if not enough data."""
        if (new := self._admitted()) is None:
            return None
        behaviour: dict[str, Any] = {}
        try:
            with self.phases("audit"):
                taken = self._audited(self.buffer.take(self.auditor.kind_of, new))
            if self.recompute is not None and taken:
                with self.phases("recompute"):
                    taken, dropped, behaviour = self.recompute(taken)
                self._drop_claims(dropped)
        finally:
            self.auditor.release()  # never held through a training step
        taken = self._within_share(taken)
        if not taken:
            return None  # every group taken failed an audit, or only foreign ones were left: nothing to train on now
        self._said_only_foreign = False
        parts, skipped = self.training.parts(taken)
        rec: dict[str, Any] = {Metric.KIND: Kind.STEP, Metric.VERSION: self.version + 1, **batch_stats(taken, self.version), **behaviour}
        rec[Metric.GROUPS_SKIPPED_ZERO_VAR] = skipped
        trained_s = self.training.time_s
        try:
            with self.phases("train"):
                self.training.train(parts, rec)
        except Exception as e:  # e.g. out of memory: these groups go to quarantine, training goes on
            log.exception("a step on %d groups failed; they are quarantined, not retried", len(taken))
            self.training.abandon()
            for b in taken:
                self.quarantine(b.raw, f"step: {type(e).__name__}: {e}")
            self.books.drop(Drop.QUARANTINED, len(taken))
            if self.leader is not None:
                raise  # the ranks are out of step now: end the job (torchrun restarts it from a checkpoint)
            return None
        # the groups trained: those without signal (every reward equal) are skipped by the step
        self.auditor.budget.trained(self.training.time_s - trained_s, sum(has_signal(b.group.rewards) for b in taken))
        if gap_dropped := self.training.mark_gap_drops(taken, rec):
            self.books.drop(Drop.LOGPROB_GAP, gap_dropped)
        self.books.count_trained(taken, self.auditor.archive.auditable, self.peer_id)
        self.version += 1
        with self.phases("publish"):
            rec.update(self.publishing.maybe(self.version))
        rec.update(counters(self.books, self.auditor, self.training, len(self.buffer), self._t0))
        rec.update(self.step_extra())
        rec[Metric.PHASE_S] = self.phases.snapshot()
        self._emit(rec)
        if self.cfg.eval_every and self.version % self.cfg.eval_every == 0:
            self.run_eval()
        return rec  # when to checkpoint is the runner's (cli/roles/learner.py): it compacts its journal after

    def _within_share(self, taken: list[BufferedGroup]) -> list[BufferedGroup]:
        """`taken` with its foreign groups within their share of what audits and recomputation left
        of the step (`within_share`); those past it go back to the buffer for a later step."""
        keep = set(within_share([self.auditor.kind_of(b) for b in taken], self.cfg.foreign.step_share))
        if len(keep) < len(taken):
            self.buffer.put_back([b for i, b in enumerate(taken) if i not in keep])
        return [b for i, b in enumerate(taken) if i in keep]

    def _audited(self, taken: list[BufferedGroup]) -> list[BufferedGroup]:
        """Spot-audit `taken` (node/audit/auditor.py), refuse who failed; what may be trained on.
        New keys' groups whose first audits the budget cannot afford yet go back to the buffer."""
        outcome = self.auditor.audit(taken)
        if outcome.waiting:
            self.buffer.put_back(outcome.waiting)
            waiting = {id(b) for b in outcome.waiting}
            taken = [b for b in taken if id(b) not in waiting]
        for sampler, why in outcome.failed.items():
            if sampler not in self.auditor.refusals:
                self.refuse(sampler, why)
        # all refusals first: a sampler's group that passed (or was not chosen) is not kept when
        # another of its groups in this step failed. An unauditable group (made by weights we no
        # longer hold: an earlier run's chain) is trained on, never lost (the gap check and the
        # dual clip still bound it), but unchecked work earns no credit (`_credit`)
        return [b for b in taken if b.sampler not in self.auditor.refusals]

    def _drop_claims(self, dropped: list[BufferedGroup]) -> None:
        """Groups whose claims were further than `max_logprob_gap` from the recomputed log-probs:
        counted as the trainer's check counts its drops."""
        for b in dropped:
            self.training.gap_drop(b)
        if dropped:
            self.books.drop(Drop.LOGPROB_GAP, len(dropped))

    def refuse(self, sampler: str, why: str) -> None:
        """Refuse `sampler` for good: drop its buffered groups, revoke its credit, persist the refusal."""
        self.auditor.refusals.add(sampler, why)
        dropped = self.buffer.drop_sampler(sampler)
        self.books.drop(Drop.REFUSED_SAMPLER, dropped + 1)
        self.books.credit.revoke(sampler)
        log.warning("refused sampler %s for good (%s); %d buffered groups dropped, its credit revoked",
                    sampler, why, dropped)

    # ---- eval and publishing ---------------------------------------------------------------------
    def run_eval(self) -> float:
        with self.phases("eval"):
            acc = evaluate(self.engine, self.task, self.eval_set, self.sampling.max_new_tokens)
        self._emit({Metric.KIND: Kind.EVAL, Metric.VERSION: self.version, Metric.EVAL_ACC: acc, Metric.TIME_S: round(time.time() - self._t0, 2)})
        return acc

    def _emit(self, rec: dict) -> None:
        self.history.append(rec)
        if self.metrics is not None:
            self.metrics.write(rec)
        if self.on_record:
            self.on_record(rec)

    def start(self) -> None:
        """Publish the starting weights (version 0 or the resumed one) so samplers can align."""
        with self.phases("publish"):
            stats = self.publishing.publish(self.version)
        if stats:
            log.info("published version %d: a %s keyframe of %.1f MB", self.version,
                     self.publishing.publisher.view_name, stats["weights_bytes"] / 1e6)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: tensors, optimizer, the untrained buffer (records
        as received), each part's state (JSON-able) and `checkpoint_extra()` from the runner."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.training.optimizer_state(),
            "buffer": self.buffer.state_dict(),
            "meta": {"format": FORMAT, "version": self.version, "books": self.books.state_dict(),
                     "checks": self.checks.state_dict(), "auditor": self.auditor.state_dict(),
                     "training": self.training.state_dict(), "chains": self.chains.state_dict(self.version),
                     "losses": losses_of(self.cfg), "extra": self.checkpoint_extra(), "rng": rng_state()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        meta = load_learner_state(state["meta"])  # also sets the RNGs
        self.model.load_state_dict(state["model"])
        self.training.load_optimizer_state(state["model"], state["optimizer"])
        self.version = meta["version"]
        for name in ("books", "checks", "auditor", "training", "chains"):
            getattr(self, name).load_state_dict(meta[name])
        self.restored_extra = meta["extra"]
        say_if_losses_differ(meta.get("losses"), self.cfg)
        self.buffer.clear()
        older = 0
        for raw in state["buffer"]:
            # validated and accepted before the save: re-accept without counting twice (but not a
            # sampler refused since, whose refusal the checkpoint may predate)
            try:
                group = decode_rollout_group(raw, strict=False)  # accepted, maybe under older bounds
            except RecordError as e:
                if e.reason != Drop.PROTOCOL:
                    raise
                older += 1  # sampled under another protocol's rule: its audit would refuse an honest sampler
                continue
            if group.sampler in self.auditor.refusals:
                continue
            if self._accept(group, raw, count=False) == REWARD_BUDGET:  # in time before the save, not now
                self.books.drop(REWARD_BUDGET)
        if older:
            log.warning("checkpoint: %d buffered groups of an older protocol dropped (not auditable now)", older)
        for sampler in self.auditor.refusals.refused:
            self.books.credit.revoke(sampler)

    def save_checkpoint(self, directory: Path) -> Path:
        return save_checkpoint(directory, self.version, self.state_dict(), keep=self.cfg.checkpoint.keep)

    def load_checkpoint(self, path: Path) -> None:
        self.load_state_dict(load_checkpoint(path))
