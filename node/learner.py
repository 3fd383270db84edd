"""The learner role: validate rollout records, recompute rewards, route, train, publish versions.

Invariants (what makes off-policy training here correct):
  * every accepted group carries the policy version that generated it, and its staleness is
    `learner.version - group.version` at the moment it is trained on;
  * a group older than `max_staleness` versions is never trained on (dropped and counted, at
    ingest and again at batch time, since it may age in the buffer);
  * rewards are recomputed from the completion text with the task's verifier; the sampler's
    claimed reward is only compared (`reward_claim_mismatch`), never used;
  * a record is validated completely before it is accepted, and once accepted it is kept (in
    the buffer and in checkpoints) until trained on or dropped as stale, never lost.

Routing (docs/DESIGN.md, "The algorithms"): rollouts of the learner's own model go to `stale_loss` (GEPO by
default), rollouts of another model to `foreign_loss` (F-TIS by default); either may be "drop".
A foreign model with another tokenizer is re-tokenized and corrected at sequence level.
"""

from __future__ import annotations

import array
import base64
import collections
import copy
import hashlib
import logging
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from swarm.exchange import LearnerLink, WeightVersion
from swarm.records import RecordError, RolloutGroup, decode_rollout_group

from .accounting import Tally
from .algorithms import get_algorithm, has_signal
from .audit import AuditItem, AuditResult, RefusalList, VersionArchive, audit_groups
from .checkable import group_seeds
from .config import ConfigError, SamplingConfig
from .engines.base import Completion
from .engines.hf import HFEngine
from .evaluate import eval_problems, evaluate
from .guard import GuardConfig, guard_scale
from .metrics import MetricsWriter
from .models import tokenizer_hash
from .tasks import Task
from .trainer import ScoredGroup, StepOptions, TrainPart, build_batch, train_step
from .weight_codec import Publisher, PublishConfig, publish_due
from .weights import encode_version, retie, untie, version_nonce

log = logging.getLogger(__name__)

DROP = "drop"
MAX_CHARS_PER_TOKEN = 64
"""Bound on a completion's text per token (the longest tokens of real vocabularies are far shorter)."""
MAX_CHAINS = 16
"""Earlier runs' chains remembered (their rollouts may still arrive from samplers' outboxes)."""


@dataclass
class LearnerConfig:
    """The `[learner]` table: how rollouts are corrected and trained on. What the learner trains
    (model, task, sampling) lives in the top-level config, shared with the samplers."""

    stale_loss: str = "grpo"
    """Loss for rollouts of our own model (any version): grpo, gepo, dr_grpo, gspo, m2po, pg or drop.
    GRPO by evidence: it held at every max delay measured where GEPO lost (docs/RESULTS.md, "Defaults")."""
    stale_options: dict[str, Any] = field(default_factory=dict)
    """Fields of that loss's config, e.g. {eps = 0.2, beta = 0.005} for GEPO."""
    foreign_loss: str = "ftis"
    """Loss for rollouts of other models: ftis, pg, grpo, ... or drop."""
    foreign_options: dict[str, Any] = field(default_factory=dict)
    accept_models: tuple[str, ...] = ("*",)
    """Foreign model ids whose rollouts are accepted; "*" accepts any (that shares our tokenizer,
    or whose tokenizer is in `foreign_tokenizers`). A model in our tokenizer is taken as foreign
    (unaudited, within the foreign share) only if named here; under any other id its rollouts
    are checked as our own (audits, gap check, version, staleness): a label proves nothing."""
    foreign_tokenizers: dict[str, str] = field(default_factory=dict)
    """Other models' tokenizers, model id -> a local tokenizer folder. Rollouts of a model with
    another tokenizer are taken only from these: the learner decodes their tokens and checks them
    against the text (text it cannot check would let a peer claim anything), then re-tokenizes."""
    max_staleness: int = 64
    """Rollouts more than this many versions old are dropped (counted), never trained on."""
    take_newest: bool = False
    """Train on the newest buffered groups first (GEPO's released learner) rather than the oldest
    (ours: nothing waits past its turn, so nothing ages out unused)."""
    wait_staleness: int = 0
    """Take no own-model group more than this many versions old (GEPO's released learner: 32,
    which then waits for fresher data): they are dropped and counted, so they never hold a
    sampler's quota while the learner waits; 0: only `max_staleness` applies."""
    groups_per_step: int = 16
    lr: float = 3e-5
    """AdamW learning rate (1e-4 and above destabilises the built-in tiny model: measured)."""
    max_grad_norm: float = 1.0
    max_tokens_per_microbatch: int = 16384
    """Padded tokens per forward/backward (node/trainer.py): bounds the learner's activation
    memory whatever groups_per_step and the completion lengths are; the step is the same (the
    gradients accumulate to the full batch's). 0: the whole step in one pass."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward (transformers' gradient checkpointing):
    about a third more compute for far less activation memory on long completions."""
    eval_every: int = 50
    """Greedy eval on held-out problems every N versions (0: only at the start and the end)."""
    eval_size: int = 300
    quota_per_sampler: int = 64
    """Groups one sampler may have received and not yet trained on; past it, its sends are answered
    "busy" (kept in its outbox for later), so one peer's flood slows only that peer."""
    rate_per_sampler: float = 64.0
    """Records per second the learner checks from one sampler (signature, decode, checks); past it
    they are answered "busy" unread, so a flood cannot eat the learner's CPU."""
    byte_rate_per_sampler: float = 8.0 * 2**20
    """Bytes per second the learner reads from one sampler, counted on what it sent before anything
    is decoded: undecodable bytes cost it as much as records do."""
    journal_bytes_per_sampler: int = 64 * 2**20
    """Bytes of one sampler's records in the journal that the learner has not read yet (it reads
    between steps, so they pile up during a long one); one record always fits, whatever its size."""
    unproven_quota: int = 32
    """Keys are free, so samplers that have not yet passed their first `audit_first` audits share
    one budget: this many groups received and not yet trained on, all of them together (at least
    `groups_per_step` is used, so that new samplers can fill a step and be audited)..."""
    unproven_rate: float = 8.0
    """...this many of their records checked per second, all together..."""
    unproven_byte_rate: float = 1.0 * 2**20
    """...this many of their bytes read per second..."""
    unproven_journal_bytes: int = 16 * 2**20
    """...and this many bytes of their records in the journal not yet read. A proven sampler keeps
    its own budget whatever unproven keys send (docs/DESIGN.md, "Trust")."""
    max_buffer_groups: int = 4096
    """Bound on accepted-but-untrained groups; beyond it new records are refused (counted), so
    memory stays bounded without dropping anything already accepted."""
    max_logprob_gap: float = 4.0
    """Own-model sequences whose claimed behaviour log-probs differ from the learner's own by more
    than this (mean |gap| per token, nats) are dropped from the step and counted against their
    sampler. Honest gaps come from staleness and engine numerics: at most 2.07 at 64 versions
    stale (examples/bench_logprob_gap.py); a claim of -18/token is >= 13 away. What passes is
    still bounded by the dual clip (node/algorithms/base.py)."""
    audit_first: int = 4
    """Own-model groups audited for checkable sampling (node/audit.py) from each new sampler..."""
    audit_rate: float = 0.1
    """...and the share of its groups audited after those, chosen at random by the learner..."""
    audit_trusted_after: int = 32
    """...until it has passed this many audits; from then on, `audit_rate_trusted` of its groups.
    New keys are audited heavily, a long record lightly: one failed audit still refuses the sampler
    and revokes all its credit, so cheating on k groups is caught with probability
    1 - (1 - audit_rate_trusted)^k (k = 100: 95% at 3%)."""
    audit_rate_trusted: float = 0.03
    audit_tolerance: float = 1e-3
    """Slack in CDF units around each token's interval for engine numerics (node/checkable.py)..."""
    audit_rel_tolerance: float = 0.0
    """...plus this much times the boundary's room m = min(C, 1 - C): an engine whose logits differ
    from ours by at most e moves a boundary by <= m * range(e) / T (node/checkable.miss_distances).
    0 audits float32 samplers tightly. Honest bfloat16 samplers need about 0.25-0.5 (they miss by
    up to d/m = 0.05 on the built-in model, 0.25 on a deeper one), and every bit of it is room an
    attacker who computes u_t can use: at 0.25 a completion swapped for the right answer passes
    16% of audits instead of 0.3% (examples/bench_bf16_audit.py, examples/bench_audit.py;
    docs/DESIGN.md, "Trust"). So bfloat16 samplers stay opt-in."""
    audit_logprob_gap: float = 0.25
    """An audited group also fails if its claimed log-probs are further than this (mean |gap| per
    token) from ours at the very version it claims: honest engines are within 1e-5 in float32."""
    foreign_step_share: float = 0.25
    """Foreign groups (never audited: unchecked work, not credited) fill at most this share of a
    step's groups (floor of share x groups_per_step); F-TIS bounds one step's damage, this a flood."""
    foreign_per_sampler: int = 2
    """...and at most this many of a step's groups come from one sampler's foreign groups."""
    unaudited_per_step: int = 2
    """Groups of a step from samplers not yet proven (`is_proven`) whose version the learner cannot
    rebuild to audit (an earlier run's chain), all such samplers together: such a key is never
    audited, so it is trained on only this much (and not credited). A restart opens no window."""
    checkpoint_every: int = 0
    """Save every N versions (0: only when asked)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk; older ones are deleted."""
    weights: PublishConfig = field(default_factory=PublishConfig)
    """How versions go out: the view samplers run, lossless patches of it between keyframes, and how
    often (every N steps, seconds or an upload budget)."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The divergence guard (node/guard.py): the lr shrinks while the policy runs away from the
    rollouts it trains on (k3 per token above `kl_high`) and comes back once they agree again."""

    def __post_init__(self) -> None:
        for name, opts in ((self.stale_loss, self.stale_options), (self.foreign_loss, self.foreign_options)):
            if name != DROP:
                get_algorithm(name).make_config(opts)
        if self.max_staleness < 0 or self.groups_per_step < 1 or self.eval_every < 0 or self.eval_size < 1 \
                or self.wait_staleness < 0:
            raise ValueError("learner: need max_staleness >= 0, groups_per_step >= 1, eval_every >= 0, eval_size >= 1, "
                             "wait_staleness >= 0")
        if not self.max_logprob_gap > 0 or not self.audit_logprob_gap > 0 or self.audit_first < 0 or not 0 <= self.audit_rate <= 1 \
                or not 0 <= self.audit_rate_trusted <= 1 or self.audit_trusted_after < self.audit_first \
                or not 0 <= self.audit_tolerance < 1 or not 0 <= self.audit_rel_tolerance < 1:
            raise ValueError("learner: need max_logprob_gap > 0, audit_first >= 0, 0 <= audit_rate <= 1, "
                             "0 <= audit_rate_trusted <= 1, audit_trusted_after >= audit_first, "
                             "0 <= audit_tolerance < 1, 0 <= audit_rel_tolerance < 1")
        if self.quota_per_sampler < 1 or self.rate_per_sampler <= 0 or self.unproven_quota < 1 \
                or min(self.unproven_rate, self.byte_rate_per_sampler, self.unproven_byte_rate) <= 0:
            raise ValueError("learner: quota_per_sampler and unproven_quota must be >= 1, rate_per_sampler, "
                             "unproven_rate, byte_rate_per_sampler and unproven_byte_rate > 0")
        if min(self.journal_bytes_per_sampler, self.unproven_journal_bytes) < 1:
            raise ValueError("learner: journal_bytes_per_sampler and unproven_journal_bytes must be >= 1")
        if self.max_tokens_per_microbatch < 0:
            raise ValueError("learner: max_tokens_per_microbatch must be >= 0 (0: the whole step at once)")
        if any(not m or len(m) > 256 for m in self.accept_models):  # they go into the peer record (swarm/dht.py)
            raise ValueError("learner: accept_models entries must be model ids of 1-256 characters")
        if not 0 <= self.foreign_step_share <= 1 or self.foreign_per_sampler < 0 or self.unaudited_per_step < 0:
            raise ValueError("learner: need 0 <= foreign_step_share <= 1, foreign_per_sampler >= 0, "
                             "unaudited_per_step >= 0")
        if self.lr <= 0 or self.max_grad_norm <= 0 or self.keep_checkpoints < 1 or self.checkpoint_every < 0:
            raise ValueError("learner: need lr > 0, max_grad_norm > 0, keep_checkpoints >= 1, checkpoint_every >= 0")


@dataclass
class BufferedGroup:
    group: ScoredGroup
    route: str
    """'stale' (own model), 'foreign' (shared tokenizer) or 'foreign_seq' (re-tokenized)."""
    sampler: str
    raw: bytes
    """The record as received, kept for checkpoints."""
    chain: str = ""
    claimed_version: int = 0
    """The version the record names (group.version may be clamped, see _accept): audits rebuild it."""


class Learner:
    def __init__(self, cfg: LearnerConfig, model, tokenizer, task: Task, *, model_id: str,
                 sampling: SamplingConfig = SamplingConfig(), swarm: str = "local", link: LearnerLink | None = None,
                 peer_id: str = "learner", checkpoint_dir: str | Path | None = None,
                 metrics: MetricsWriter | None = None, chain: str | None = None,
                 compute_dtype: torch.dtype | None = None, leader=None) -> None:
        """`model` sits on the device it trains on, in float32 (master weights); `compute_dtype`
        (e.g. bfloat16 on a GPU) is what its forward runs in, under autocast.

        `leader` (node.distributed.Leader): this is rank 0 of an FSDP2 learner. The ranks train
        the sharded copy together; `model` is then an unsharded copy that the gathered weights
        are loaded into after every step, for evaluation, audits and publishing."""
        self.leader = leader
        self.cfg = cfg
        self.model = model.eval()
        if cfg.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.step_options = StepOptions(cfg.max_tokens_per_microbatch or None, compute_dtype)
        self.tok = tokenizer
        self.task = task
        self.model_id = model_id
        self.sampling = sampling
        self.swarm = swarm
        self.link = link
        self.peer_id = peer_id
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.metrics = metrics
        self.tokenizer_id = tokenizer_hash(tokenizer)
        self.vocab_size = len(tokenizer)
        self.foreign_toks = {model: _local_tokenizer(path) for model, path in cfg.foreign_tokenizers.items()}
        """model id -> (its tokenizer, its hash), for checking foreign rollouts' text."""
        self.version = 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
        self.lr_scale = 1.0
        """The divergence guard's scale on `cfg.lr` for the next step (node/guard.py)."""
        self.engine = HFEngine(model, tokenizer, model_id)  # for evaluation only
        self.publisher = Publisher(cfg.weights, cfg.weights.view_dtype(next(model.parameters()).device))
        self._last_publish = (0, 0.0, 0)
        """(version, time.monotonic(), bytes) of the last version published: `publish_due`'s inputs."""
        self.chain = chain or uuid.uuid4().hex[:12]
        """Id of this run's version chain: deltas apply only to weights of the same chain. Random
        by default; a fixed one (the simulator's) makes sampling reproducible, since the versions'
        nonces (node/checkable.py) hash the published bytes, the chain id among them."""
        self.routes = {"stale": cfg.stale_loss, "foreign": cfg.foreign_loss, "foreign_seq": cfg.foreign_loss}
        self.buffer: collections.deque[BufferedGroup] = collections.deque()
        self._buffered: collections.Counter[str] = collections.Counter()
        """Groups in the buffer per sampler."""
        self.seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.seen_content: collections.OrderedDict[str, None] = collections.OrderedDict()
        """Content keys (prompt + every completion's tokens, in any order) of accepted groups."""
        self.drops: collections.Counter[str] = collections.Counter()
        self.throttled: collections.Counter[str] = collections.Counter()
        """Rollouts the swarm's receiver answered "busy" (not drops: the sampler sends them again later),
        by the bound they met; it counts into this (swarm/rollout_rpc.py)."""
        self.accepted_by_sampler: collections.Counter[str] = collections.Counter()
        self.tally = Tally()
        """Credit per sampler for the groups trained on (published to the DHT for the leaderboard)."""
        self.reward_claim_mismatch = 0
        self.version_clamped = 0
        """Rollouts from a previous run's versions beyond our resumed version (see _accept)."""
        self.known_chains: dict[str, int] = {}
        """Chains of this learner's earlier runs (from its checkpoints) -> the last version each
        reached: their rollouts are sound; rollouts of any other chain are refused."""
        self.quarantine: Callable[[bytes, str], None] = lambda raw, why: None
        """Where a record that broke ingest or a step goes, with the reason (never replayed)."""
        weights, self._aliases = untie(model.state_dict())
        self.archive = VersionArchive(cfg.max_staleness + 1)
        """Our published versions, rebuilt for audits (node/audit.py); the base model as ("", 0)."""
        self.archive.put_base(weights)
        self.refusals = RefusalList(self.checkpoint_dir / "refused.json" if self.checkpoint_dir else None)
        """Samplers that failed an audit: refused for good, also after a restart."""
        self.audits: collections.Counter[str] = collections.Counter()
        """Audits done per sampler (the first `audit_first` of each are always done)."""
        self.audit_stats = {"audits": 0, "failed": 0, "unauditable": 0, "positions": 0, "time_s": 0.0,
                            "logprob_gap_max": 0.0}
        self.gap_drops: collections.Counter[str] = collections.Counter()
        """Sequences dropped by the log-prob check, per sampler."""
        self._audit_model = None
        self._audit_loaded: tuple[str, int] | None = None
        self.train_time_s = 0.0
        """Seconds spent in optimizer steps (forward, backward, update): what audits are measured against."""
        self._audit_rng = random.SystemRandom()  # the sampler must not predict which groups get audited
        self.eval_set = eval_problems(task, cfg.eval_size)
        self.history: list[dict] = []
        self.on_record: Callable[[dict], None] | None = None
        self.checkpoint_extra: Callable[[], dict] = dict
        """Extra state saved with each checkpoint (the swarm runner saves its journal cursor)."""
        self.restored_extra: dict = {}
        self._t0 = time.time()

    # ---- ingest ----------------------------------------------------------------------------------
    def ingest(self, data: bytes) -> str | None:
        """Validate and accept one record; returns None if accepted, else the drop reason."""
        group = None
        try:
            group = decode_rollout_group(data)
            reason = self._check(group)
            if reason is None:
                reason = self._accept(group, data)
        except RecordError as e:
            reason = e.reason
            log.warning("rejected a rollout record: %s", e)
        except Exception as e:  # a record must never crash the learner, now or when the journal replays
            reason = "quarantined"
            log.exception("a rollout record broke ingest; quarantined")
            self.quarantine(data, f"ingest: {type(e).__name__}: {e}")
        if reason is not None:
            self.drops[reason] += 1
            if group is not None:
                log.info("dropped group %s from %s (v%d): %s", group.id[:8], group.sampler, group.version, reason)
        return reason

    def ingest_many(self, records: list[bytes]) -> int:
        return sum(self.ingest(r) is None for r in records)

    def ingest_own(self, group: RolloutGroup, raw: bytes | None = None) -> str | None:
        """Accept a group this process's own sampler made with this learner's weights, in memory
        (`join --role sampler,learner`): none of a peer's checks apply (there is no peer), it is not
        audited (same weights, same process) and it earns no credit on our own tally (the
        leaderboard refuses a learner that credits itself). The buffer's bounds still hold. `raw`: the
        group's encoding, when the caller has it already."""
        return self._accept(group, raw if raw is not None else group.encode())

    def precheck(self, group: RolloutGroup) -> str | None:
        """The checks of `ingest` without accepting: the swarm runs them before it acknowledges a
        record, so a refused record never reaches the journal. Never raises."""
        try:
            return self._check(group)
        except Exception:
            log.exception("checking a rollout record failed")
            return "internal_error"

    def is_proven(self, peer: str) -> bool:
        """Whether `peer` passed its first `audit_first` audits and was never refused: until then
        the swarm's receiver counts its records against one budget shared by all such keys."""
        return peer not in self.refusals and self.audits[peer] >= self.cfg.audit_first

    def untrained_by(self, sampler: str) -> int:
        """Groups of `sampler` accepted and not yet trained on (its share of the buffer)."""
        return self._buffered[sampler]

    def _check(self, g: RolloutGroup) -> str | None:
        """Semantic checks after the structural ones of swarm.records; a reason code or None."""
        if g.sampler in self.refusals:
            return "refused_sampler"  # failed an audit: nothing of it is taken, ever
        if g.swarm != self.swarm:
            return "wrong_swarm"
        if g.task != self.task.name:
            return "wrong_task"
        if g.id in self.seen:
            return "duplicate"
        if _content_key(g) in self.seen_content:
            return "duplicate_content"  # the same completions under a new id earn nothing twice
        problem = self.task.get(g.prompt_id)
        if problem is None or problem.prompt != g.prompt:
            return "unknown_prompt"
        if g.model_id != self.model_id and "*" not in self.cfg.accept_models and g.model_id not in self.cfg.accept_models:
            return "unknown_model"
        own = self._checked_as_own(g)
        if own and (reason := self._check_version(g)) is not None:
            return reason
        if len(g.completions) != self.sampling.group_size:
            return "wrong_group_size"
        too_long = self.sampling.max_new_tokens
        if any(len(c.token_ids) > too_long or len(c.text) > MAX_CHARS_PER_TOKEN * too_long for c in g.completions):
            return "too_long"
        if not math.isclose(float(g.sampling.get("temperature", -1)), self.sampling.temperature):
            return "wrong_temperature"
        if any(lp > 1e-4 for c in g.completions for lp in c.logprobs):
            return "positive_logprob"
        if any(not c.token_ids for c in g.completions):
            return "empty_completion"
        if g.tokenizer == self.tokenizer_id:
            if any(t >= self.vocab_size for c in g.completions for t in c.token_ids):
                return "token_out_of_vocab"
            if any(self.tok.decode(c.token_ids, skip_special_tokens=True) != c.text for c in g.completions):
                return "text_mismatch"
        elif own:
            return "wrong_tokenizer"
        else:
            known = self.foreign_toks.get(g.model_id)
            if known is None or known[1] != g.tokenizer:
                return "unknown_tokenizer"  # tokens we cannot decode: the text would be unchecked
            tok = known[0]
            if any(t >= len(tok) for c in g.completions for t in c.token_ids):
                return "token_out_of_vocab"
            if any(tok.decode(c.token_ids, skip_special_tokens=True) != c.text for c in g.completions):
                return "text_mismatch"
        if not own and (reason := _foreign_version(g, self.chain, self.known_chains)) is not None:
            return reason
        if own and self.version - g.version > self.cfg.max_staleness:
            return "stale"
        return None

    def _checked_as_own(self, g: RolloutGroup) -> bool:
        """Whether `g` is checked as our model's (audits, gap check, version, staleness): ours, or
        in our tokenizer under a model id the operator did not name, whose label proves nothing."""
        return g.model_id == self.model_id or (g.tokenizer == self.tokenizer_id
                                               and g.model_id not in self.cfg.accept_models)

    def _check_version(self, g: RolloutGroup) -> str | None:
        """A version of this run's chain we have published, of an earlier run's chain up to where
        it got, or version 0 of no chain (a sampler that has not loaded weights yet)."""
        if g.chain == "":
            return None if g.version == 0 else "future_version"
        if g.chain == self.chain:
            if g.version > (self.publisher.version or 0):
                return "future_version"
            # versions between published ones (publish cadence) were never sent: no sampler held one
            recent = self.version - g.version <= self.cfg.max_staleness
            return "unpublished_version" if recent and not self.archive.holds(g.chain, g.version) else None
        last = self.known_chains.get(g.chain)
        if last is None:
            return "unknown_chain"  # not a chain this learner ever ran: forged or another learner's
        return "future_version" if g.version > last else None

    def _accept(self, g: RolloutGroup, raw: bytes, count: bool = True) -> str | None:
        own = self._checked_as_own(g)
        route = "stale" if own else ("foreign" if g.tokenizer == self.tokenizer_id else "foreign_seq")
        if self.routes[route] == DROP:
            return "foreign_dropped" if not own else "own_dropped"
        if count and len(self.buffer) >= self.cfg.max_buffer_groups:
            return "buffer_full"
        problem = self.task.get(g.prompt_id)
        rewards = [self.task.reward(c.text, problem.answer) for c in g.completions]
        prompt_ids = self.tok(g.prompt, add_special_tokens=False)["input_ids"]
        if route == "foreign_seq":
            # the same event on both sides: the text, plus its end only where the generator ended it
            # (a completion cut by length has no EOS, and g's log-prob does not include one)
            comps = [Completion(self.tok(c.text, add_special_tokens=False)["input_ids"]
                                + ([self.tok.eos_token_id] if c.finish_reason == "stop" else []),
                                c.text, [], c.finish_reason) for c in g.completions]
            seq_logp = [sum(c.logprobs) for c in g.completions]
        else:
            comps = [Completion(c.token_ids, c.text, c.logprobs, c.finish_reason) for c in g.completions]
            seq_logp = None
        version = g.version if own else 0  # a partner's version numbers its own chain: meaningless here
        if own and version > self.version:
            # made by weights of this learner's previous run (it resumed from an older checkpoint):
            # the rollout is sound, its version number is from a lost branch; count it as fresh
            version = self.version
            if count:
                self.version_clamped += 1
        scored = ScoredGroup(g.prompt_id, prompt_ids, comps, rewards, g.model_id, version, seq_logp)
        self.buffer.append(BufferedGroup(scored, route, g.sampler, raw, g.chain, g.version))
        self._buffered[g.sampler] += 1
        self._remember(g)
        if count:
            self.reward_claim_mismatch += sum(c.reward != r for c, r in zip(g.completions, rewards))
        return None

    def _remember(self, g: RolloutGroup) -> None:
        self.seen[g.id] = None
        self.seen_content[_content_key(g)] = None
        for seen in (self.seen, self.seen_content):
            while len(seen) > 200_000:  # bounded: duplicates older than this are caught as stale
                seen.popitem(last=False)

    # ---- train -----------------------------------------------------------------------------------
    def _drop_stale_buffered(self) -> None:
        limit = min(self.cfg.max_staleness, self.cfg.wait_staleness or self.cfg.max_staleness)
        keep = collections.deque()
        for b in self.buffer:
            if b.route == "stale" and self.version - b.group.version > limit:
                self.drops["stale"] += 1
                self._buffered[b.sampler] -= 1
            else:
                keep.append(b)
        self.buffer = keep

    def ready(self) -> bool:
        """Whether a full step can be taken within the foreign and unaudited shares; or a short one,
        of what the shares allow, when `groups_per_step` groups wait and waiting cannot fill a step:
        none of them is checked work, or unproven keys' groups fill their shared budget (the swarm's
        receiver takes no more from any new key until some are trained on: waiting would stall)."""
        self._drop_stale_buffered()
        n = self.cfg.groups_per_step
        if len(self.buffer) < n:
            return False
        picked = len(self._pick())
        if picked >= n or picked == 0:
            return picked >= n
        if all(self._kind(b) != "checked" for b in self.buffer):
            return True
        unproven = sum(not self.is_proven(b.sampler) for b in self.buffer)
        return unproven >= max(self.cfg.unproven_quota, n)

    def _kind(self, b: BufferedGroup) -> str:
        """'foreign' (never audited), 'unaudited' (a version we cannot rebuild, from a sampler not yet
        proven: nothing of that key was ever checked) or 'checked' (auditable, or a proven sampler's)."""
        if b.route != "stale":
            return "foreign"
        if b.sampler == self.peer_id:
            return "checked"  # made here with these weights (ingest_own): nothing to prove
        if not self.archive.auditable(b.chain, b.claimed_version) and not self.is_proven(b.sampler):
            return "unaudited"
        return "checked"

    def _pick(self) -> list[int]:
        """Indices into the buffer of the next step's groups (`pick_groups` with the shares)."""
        n = self.cfg.groups_per_step
        buf = list(self.buffer)  # a deque: indexing it is O(n)
        order = list(range(len(buf)))
        if self.cfg.take_newest:  # newest version first; arrival order among equals
            order.sort(key=lambda i: -buf[i].group.version)
        picked = pick_groups([(buf[i].sampler, self._kind(buf[i])) for i in order], n,
                             {"foreign": math.floor(self.cfg.foreign_step_share * n + 1e-9),
                              "unaudited": self.cfg.unaudited_per_step},
                             {"foreign": self.cfg.foreign_per_sampler})
        return [order[j] for j in picked]

    def step(self) -> dict | None:
        """One optimizer step on the oldest `groups_per_step` groups; None if not enough data."""
        if not self.ready():
            return None
        taken, unaudited = self._audit(self._take(self.cfg.groups_per_step))
        if not taken:
            return None  # every group taken failed an audit: nothing to train on this time
        parts, skipped = self._parts(taken)
        rec: dict[str, Any] = {"kind": "step", "version": self.version + 1, **self._batch_stats(taken)}
        rec["groups_skipped_zero_var"] = skipped
        t0 = time.perf_counter()
        try:
            if parts:
                rec.update(self._train(parts))
            self._guard(rec)
        except Exception as e:  # e.g. out of memory: these groups go to quarantine, training goes on
            log.exception("a step on %d groups failed; they are quarantined, not retried", len(taken))
            self._quarantine_step(taken, f"step: {type(e).__name__}: {e}")
            if self.leader is not None:
                raise  # the ranks are out of step now: end the job (torchrun restarts it from a checkpoint)
            return None
        self.train_time_s += time.perf_counter() - t0
        failed_gap = self._count_gap_drops(taken, rec.get("routes", {}))
        for b in taken:
            self.accepted_by_sampler[b.sampler] += 1
            # credit only what was trained on and passed every check: zero-variance groups (garbage
            # included) carry no gradient, a group with a sequence over the log-prob gap earns nothing,
            # nor unchecked work: foreign groups (never audited) and versions we cannot rebuild to audit
            checkable = b.route == "stale" and self.archive.auditable(b.chain, b.claimed_version)
            if (has_signal(b.group.rewards) and id(b) not in failed_gap and id(b) not in unaudited and checkable
                    and b.sampler != self.peer_id):
                self.tally.credit(b.sampler, len(b.group.completions),
                                  sum(len(c.token_ids) for c in b.group.completions), b.group.model_id)
        self.version += 1
        rec.update(self._maybe_publish())
        rec.update(self._counters())
        self._emit(rec)
        if self.cfg.eval_every and self.version % self.cfg.eval_every == 0:
            self.run_eval()
        if self.checkpoint_dir and self.cfg.checkpoint_every and self.version % self.cfg.checkpoint_every == 0:
            self.save_checkpoint(self.checkpoint_dir)
        return rec

    def _train(self, parts: list[TrainPart]) -> dict[str, Any]:
        lr = self.cfg.lr * (self.lr_scale if self.cfg.guard.enabled else 1.0)  # (a checkpoint's scale, if off)
        if self.leader is None:
            return train_step(self.model, self.optimizer, parts, self.sampling.temperature, self.cfg.max_grad_norm,
                              self.step_options, lr=lr)
        rec = self.leader.step(parts, self.sampling.temperature, self.cfg.max_grad_norm, self.step_options, lr=lr)
        self.model.load_state_dict(self.leader.state_dict())  # the gathered weights: what we publish
        return rec

    def _guard(self, rec: dict[str, Any]) -> None:
        """Record this step's lr and move the scale for the next one from its k3 (node/guard.py)."""
        rec["lr"] = self.cfg.lr * (self.lr_scale if self.cfg.guard.enabled else 1.0)
        if rec.get("step_skipped"):  # nothing moved: nothing measured
            rec["guard_kl"], rec["guard_lr_scale"] = float("nan"), self.lr_scale
            return
        # own-model rollouts only (another model's log-probs differ by design), and their median
        # sequence: a sampler's forged claims (within the gap check) cannot slow the learner down
        kl = rec.get("routes", {}).get("stale", {}).get("kl_k3_median", float("nan"))
        before, self.lr_scale = self.lr_scale, guard_scale(self.lr_scale, kl, self.cfg.guard)
        rec["guard_kl"], rec["guard_lr_scale"] = kl, self.lr_scale
        if self.lr_scale < before:
            log.info("divergence guard: median k3 %.3f > %.3f, next lr x%.3f", kl, self.cfg.guard.kl_high, self.lr_scale)

    def _quarantine_step(self, taken: list[BufferedGroup], why: str) -> None:
        self.model.eval()
        self.optimizer.zero_grad(set_to_none=True)
        for b in taken:
            self.quarantine(b.raw, why)
        self.drops["quarantined"] += len(taken)

    def _take(self, n: int) -> list[BufferedGroup]:
        """`n` groups, round-robin over samplers, oldest first within each: no sampler takes more
        than its share of a step while others have groups waiting, however much it sent; foreign and
        unaudited groups only within their shares (`_pick`)."""
        buffered = list(self.buffer)
        taken = [buffered[i] for i in self._pick()[:n]]
        chosen = {id(b) for b in taken}
        self.buffer = collections.deque(b for b in self.buffer if id(b) not in chosen)
        for b in taken:
            self._buffered[b.sampler] -= 1
        return taken

    def _parts(self, taken: list[BufferedGroup]) -> tuple[list[TrainPart], int]:
        parts, skipped = [], 0
        for route in ("stale", "foreign", "foreign_seq"):
            groups = [b.group for b in taken if b.route == route]
            if not groups:
                continue
            algo = get_algorithm(self.routes[route])
            cfg = algo.make_config(self.cfg.stale_options if route == "stale" else self.cfg.foreign_options)
            batch = build_batch(groups, cfg.normalize_std, self.tok.pad_token_id,
                                getattr(cfg, "keep_zero_variance", False))
            skipped += len(groups) if batch is None else batch.groups_skipped
            if batch is not None:
                # claimed log-probs are checkable only for our own model (another model's differ by design;
                # F-TIS caps their weight instead)
                gap = self.cfg.max_logprob_gap if route == "stale" else None
                parts.append(TrainPart(route, batch, algo, cfg, gap))
        return parts, skipped

    def _count_gap_drops(self, taken: list[BufferedGroup], routes: dict[str, dict]) -> set[int]:
        """ids of the taken groups with a sequence dropped by the log-prob check; counted per sampler."""
        own = [b for b in taken if b.route == "stale"]
        failed = {id(own[i]) for i in routes.get("stale", {}).get("dropped_groups", [])}
        for b in own:
            if id(b) in failed:
                self.gap_drops[b.sampler] += 1
                self.drops["logprob_gap"] += 1
                log.warning("group from %s (v%d): claimed log-probs too far from ours; dropped from the step",
                            b.sampler, b.claimed_version)
        return failed

    # ---- audits ----------------------------------------------------------------------------------
    def _audit(self, taken: list[BufferedGroup]) -> tuple[list[BufferedGroup], set[int]]:
        """Spot-audit own-model groups (node/audit.py); returns those that may be trained on, and
        the ids of those among them chosen for an audit whose version we no longer hold."""
        chosen = [b for b in taken if b.route == "stale" and b.sampler != self.peer_id  # (ingest_own)
                  and (self.audits[b.sampler] < self.cfg.audit_first or self._audit_rng.random() < self.audit_rate(b.sampler))]
        # one forward pass per claimed version: its weights are rebuilt and loaded once
        by_version: dict[tuple[str, int], list[BufferedGroup]] = {}
        for b in chosen:
            by_version.setdefault((b.chain, b.claimed_version), []).append(b)
        verdicts = {}
        for key, groups in sorted(by_version.items()):
            verdicts.update(zip(map(id, groups), self._audit_version(key, groups)))
        for b in taken:
            verdict = verdicts.get(id(b), "pass")
            if verdict not in ("pass", "unauditable") and b.sampler not in self.refusals:
                self.refuse(b.sampler, verdict)
        # all refusals first: a sampler's group that passed (or was not chosen) is not kept when
        # another of its groups in this step failed
        keep = [b for b in taken if b.sampler not in self.refusals]
        # "unauditable": made by weights we no longer hold (an earlier run's chain, e.g. before a
        # crash); an accepted group is never lost, so it is trained on (the gap check and the dual
        # clip still bound it), but unchecked work earns no credit
        return keep, {id(b) for b in keep if verdicts.get(id(b)) == "unauditable"}

    def audit_rate(self, sampler: str) -> float:
        """The share of `sampler`'s groups audited once past its first `audit_first`: heavier while
        its record is short."""
        trusted = self.audits[sampler] >= self.cfg.audit_trusted_after
        return self.cfg.audit_rate_trusted if trusted else self.cfg.audit_rate

    def _audit_version(self, key: tuple[str, int], groups: list[BufferedGroup]) -> list[str]:
        """Audit groups that claim the same version; a verdict each: pass, unauditable or why it failed."""
        t0 = time.perf_counter()
        weights, nonce = self.archive.weights(*key), self.archive.nonce(*key)
        st = self.audit_stats
        if weights is None or nonce is None:
            st["unauditable"] += len(groups)
            return ["unauditable"] * len(groups)
        if self._audit_model is None:
            self._audit_model = copy.deepcopy(self.model).eval()
        if self._audit_loaded != key:
            self._audit_model.load_state_dict(retie(weights, self._aliases))
            self._audit_loaded = key
        items = [AuditItem(b.group.prompt_ids, [(c.token_ids, c.logprobs) for c in b.group.completions],
                           group_seeds(nonce, b.group.problem_id, b.sampler, len(b.group.completions))) for b in groups]
        results = audit_groups(self._audit_model, items, self.sampling.params, self.tok.pad_token_id,
                               self.cfg.audit_tolerance, self.cfg.audit_rel_tolerance)
        st["time_s"] += time.perf_counter() - t0
        return [self._verdict(b, r) for b, r in zip(groups, results)]

    def _verdict(self, b: BufferedGroup, result: AuditResult) -> str:
        self.audits[b.sampler] += 1
        st = self.audit_stats
        st["audits"] += 1
        st["positions"] += result.positions
        if result.passed and result.logprob_gap <= self.cfg.audit_logprob_gap:
            st["logprob_gap_max"] = max(st["logprob_gap_max"], result.logprob_gap)  # honest engines' numerics
            return "pass"
        st["failed"] += 1
        if not result.passed:
            return (f"audit failed: {result.failed_positions} of {result.positions} tokens are not the ones its "
                    f"randomness selects at v{b.claimed_version}")
        return f"audit failed: claimed log-probs {result.logprob_gap:.3f}/token away from v{b.claimed_version}'s"

    def refuse(self, sampler: str, why: str) -> None:
        """Refuse `sampler` for good: drop its buffered groups, revoke its credit, persist the refusal."""
        self.refusals.add(sampler, why)
        dropped = self._buffered.pop(sampler, 0)
        self.buffer = collections.deque(b for b in self.buffer if b.sampler != sampler)
        self.drops["refused_sampler"] += dropped + 1
        self.tally.revoke(sampler)
        log.warning("refused sampler %s for good (%s); %d buffered groups dropped, its credit revoked",
                    sampler, why, dropped)

    def _batch_stats(self, taken: list[BufferedGroup]) -> dict[str, Any]:
        own = [b for b in taken if b.route == "stale"]
        staleness = collections.Counter(self.version - b.group.version for b in own)
        rewards = [r for b in taken for r in b.group.rewards]
        return {
            "reward": sum(rewards) / len(rewards),
            "reward_own": _mean([r for b in own for r in b.group.rewards]),
            "reward_foreign": _mean([r for b in taken if b.route != "stale" for r in b.group.rewards]),
            "groups_own": len(own), "groups_foreign": len(taken) - len(own),
            "staleness_hist": {str(k): v for k, v in sorted(staleness.items())},
            "staleness_mean": _mean([self.version - b.group.version for b in own]),
        }

    def _counters(self) -> dict[str, Any]:
        return {"drops": dict(self.drops), "throttled": dict(self.throttled),
                "accepted_by_sampler": dict(self.accepted_by_sampler),
                "audit": dict(self.audit_stats), "logprob_gap_drops": dict(self.gap_drops),
                "train_time_s": round(self.train_time_s, 3),
                "credited": {p: c["groups"] for p, c in self.tally.peers.items()},
                "refused_samplers": len(self.refusals.refused),
                "reward_claim_mismatch": self.reward_claim_mismatch, "buffered": len(self.buffer),
                "version_clamped": self.version_clamped,
                "time_s": round(time.time() - self._t0, 2)}

    def _maybe_publish(self) -> dict[str, Any]:
        """Publish this version if the cadence (`[learner.weights]`) allows; its figures for the metrics."""
        version, at, nbytes = self._last_publish
        if not publish_due(self.cfg.weights, self.version - version, time.monotonic() - at, nbytes):
            return {}
        return self._publish()

    def _publish(self) -> dict[str, Any]:
        if self.link is None:
            return {}
        weights, aliases = untie(self.model.state_dict())
        enc = self.publisher.publish(weights, self.version)
        blob = encode_version(enc, self.model_id, self.chain, aliases)
        self.archive.put(self.chain, self.version, enc, version_nonce(blob), view=self.publisher.published)
        self.link.publish_weights(WeightVersion(self.model_id, self.chain, self.version, enc.base, blob))
        self._last_publish = (self.version, time.monotonic(), len(blob))
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in enc.stats.items()}

    def run_eval(self) -> float:
        acc = evaluate(self.engine, self.task, self.eval_set, self.sampling.max_new_tokens)
        self._emit({"kind": "eval", "version": self.version, "eval_acc": acc, "time_s": round(time.time() - self._t0, 2)})
        return acc

    def _emit(self, rec: dict) -> None:
        self.history.append(rec)
        if self.metrics is not None:
            self.metrics.write(rec)
        if self.on_record:
            self.on_record(rec)

    def start(self) -> None:
        """Publish the starting weights (version 0 or the resumed one) so samplers can align."""
        stats = self._publish()
        if stats:
            log.info("published version %d: a %s keyframe of %.1f MB", self.version, self.publisher.view_name,
                     stats["weights_bytes"] / 1e6)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: tensors, optimizer, the untrained buffer (records
        as received) and counters (JSON-able), plus `checkpoint_extra()` from the runner."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.leader.optimizer_state() if self.leader else self.optimizer.state_dict(),
            "buffer": [b.raw for b in self.buffer],
            "meta": {
                "version": self.version,
                "drops": dict(self.drops),
                "accepted_by_sampler": dict(self.accepted_by_sampler),
                "tally": {"peers": self.tally.peers, "seq": self.tally.seq},
                "reward_claim_mismatch": self.reward_claim_mismatch,
                "version_clamped": self.version_clamped,
                "seen": list(self.seen),
                "seen_content": list(self.seen_content),
                "audits": dict(self.audits),
                "audit_stats": dict(self.audit_stats),
                "gap_drops": dict(self.gap_drops),
                "lr_scale": self.lr_scale,
                "extra": self.checkpoint_extra(),
                "rng": _rng_state(),
                "chains": dict(list({**self.known_chains, self.chain: self.version}.items())[-MAX_CHAINS:]),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        meta = state["meta"]
        self.model.load_state_dict(state["model"])
        if self.leader is not None:
            self.leader.load(state["model"], state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.version = meta["version"]
        self.drops = collections.Counter(meta["drops"])
        self.accepted_by_sampler = collections.Counter(meta["accepted_by_sampler"])
        self.tally = Tally(**meta.get("tally", {}))
        self.reward_claim_mismatch = meta["reward_claim_mismatch"]
        self.version_clamped = meta.get("version_clamped", 0)
        self.seen = collections.OrderedDict.fromkeys(meta["seen"])
        self.seen_content = collections.OrderedDict.fromkeys(meta.get("seen_content", []))
        self.audits = collections.Counter(meta.get("audits", {}))
        self.audit_stats.update(meta.get("audit_stats", {}))
        self.lr_scale = float(meta.get("lr_scale", 1.0))
        self.gap_drops = collections.Counter(meta.get("gap_drops", {}))
        self.restored_extra = meta.get("extra", {})
        _set_rng_state(meta["rng"])
        self.known_chains = dict(meta.get("chains", {}))
        self.buffer.clear()
        self._buffered.clear()
        for raw in state["buffer"]:
            # validated and accepted before the save: re-accept without counting twice (but not a
            # sampler refused since, whose refusal the checkpoint may predate)
            group = decode_rollout_group(raw, strict=False)  # accepted, maybe under older bounds
            if group.sampler not in self.refusals:
                self._accept(group, raw, count=False)
        for sampler in self.refusals.refused:
            self.tally.revoke(sampler)

    def save_checkpoint(self, directory: Path) -> Path:
        from .checkpoint import save_checkpoint

        return save_checkpoint(directory, self.version, self.state_dict(), keep=self.cfg.keep_checkpoints)

    def load_checkpoint(self, path: Path) -> None:
        from .checkpoint import load_checkpoint

        self.load_state_dict(load_checkpoint(path))


def _foreign_version(g: RolloutGroup, chain: str, earlier: dict[str, int]) -> str | None:
    """A foreign generator never ran our weights: it may name its own learner's chain and version (a
    partner's, in a swarm of several learners: we can check neither and use neither), never one of
    ours (this run's `chain`, or an `earlier` run's)."""
    return "foreign_version" if g.chain and (g.chain == chain or g.chain in earlier) else None


def pick_groups(entries: list[tuple[str, str]], n: int, total_caps: dict[str, int],
                sampler_caps: dict[str, int]) -> list[int]:
    """Up to `n` indices of `entries` ((sampler, kind), oldest first), round-robin over samplers,
    oldest first within each, taking at most `total_caps[kind]` of a kind in all and at most
    `sampler_caps[kind]` of it from one sampler (kinds not named are uncapped)."""
    queues: dict[str, collections.deque[int]] = {}
    for i, (sampler, _) in enumerate(entries):
        queues.setdefault(sampler, collections.deque()).append(i)
    used: collections.Counter[str] = collections.Counter()
    used_by: collections.Counter[tuple[str, str]] = collections.Counter()
    taken: list[int] = []
    while len(taken) < n and queues:
        for sampler in list(queues):
            q = queues[sampler]
            # usage only grows within a pick, so a group over a cap now stays over it: skip it for good
            while q and (used[entries[q[0]][1]] >= total_caps.get(entries[q[0]][1], n)
                         or used_by[sampler, entries[q[0]][1]] >= sampler_caps.get(entries[q[0]][1], n)):
                q.popleft()
            if not q:
                del queues[sampler]
            elif len(taken) < n:
                i = q.popleft()
                taken.append(i)
                used[entries[i][1]] += 1
                used_by[sampler, entries[i][1]] += 1
    return taken


def _content_key(g: RolloutGroup) -> str:
    """What a group *is*, whatever its id: its prompt and its completions' tokens, in any order."""
    h = hashlib.blake2b(digest_size=16)
    h.update(g.prompt_id.encode())
    for tokens in sorted(array.array("Q", c.token_ids).tobytes() for c in g.completions):
        h.update(len(tokens).to_bytes(8, "little") + tokens)
    return h.hexdigest()


def _local_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"learner.foreign_tokenizers: cannot load a tokenizer from {path!r} ({type(e).__name__})",
                          "give a local folder saved with save_pretrained that holds the model's tokenizer") from None
    return tok, tokenizer_hash(tok)


def _rng_state() -> dict[str, Any]:
    """torch's and Python's RNG states, JSON-able: a resumed run draws what the original would."""
    version, internal, gauss = random.getstate()
    return {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "python": [version, list(internal), gauss]}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0
