"""The `[learner]` table (`LearnerConfig`): how rollouts are checked, corrected, trained on and
published. What the learner trains (model, task, sampling) lives in the top-level config, shared
with the samplers; what its door lets in is `[learner.intake]` (swarm/exchange.py `IntakeConfig`)."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

from swarm.exchange import IntakeConfig

from node.algorithms import get_algorithm
from node.training.guard import GuardConfig
from node.weights.codec import PublishConfig

BEHAVIOUR_SOURCES = ("sampler", "learner", "auto")
"""`behaviour_logprobs`: the sampler's claims, the learner's recomputation (node/learner/behaviour.py),
or the recomputation for the samplers whose claims sit far (node/audit/claim_gaps.py)."""

DROP = "drop"
"""A route's loss that trains on nothing: its groups are refused at ingest (counted)."""


@dataclass
class LearnerConfig:
    """The `[learner]` table."""

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
    """Padded tokens per forward/backward (node/training/step.py): bounds the learner's activation
    memory whatever groups_per_step and the completion lengths are; the step is the same (the
    gradients accumulate to the full batch's), except M2PO's, whose mask is computed per
    micro-batch as its released code does (node/algorithms/m2po.py). 0: the whole step in one pass."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in backward (transformers' gradient checkpointing):
    about a third more compute for far less activation memory on long completions."""
    eval_every: int = 50
    """Greedy eval on held-out problems every N versions (0: only at the start and the end)."""
    eval_size: int = 300
    intake: IntakeConfig = field(default_factory=IntakeConfig)
    """What the learner's door reads, checks and journals per sampler, and for all unproven keys
    together (`[learner.intake]`: quota, rate, byte_rate, journal_bytes and their unproven_ pool)."""
    max_buffer_groups: int = 4096
    """Bound on accepted-but-untrained groups; beyond it new records are refused (counted), so
    memory stays bounded without dropping anything already accepted."""
    max_logprob_gap: float = 4.0
    """Own-model sequences whose claimed behaviour log-probs differ from the learner's own by more
    than this (mean |gap| per token, nats) are dropped from the step and counted against their
    sampler. Honest gaps come from staleness and engine numerics: at most 2.07 at 64 versions
    stale (examples/bench_logprob_gap.py); a claim of -18/token is >= 13 away. What passes is
    still bounded by the dual clip (node/algorithms/base.py)."""
    behaviour_logprobs: str = "auto"
    """Where own-model groups' behaviour log-probs (q of every loss's ratio p/q) come from:
    "sampler", as claimed (checked against ours within `max_logprob_gap`); "learner": recomputed
    by the learner's own forward at the published weights of the version each group claims
    (node/learner/behaviour.py), so that a sampler computing in another precision (bfloat16 on a GPU)
    or with other kernels makes no ratio differ from 1 on-policy; or "auto": recomputed for the
    samplers whose claims, measured by the audits and the recomputations, sit further than
    `behaviour_auto_k3` from ours, and for those not measured yet (node/audit/claim_gaps.py).
    Recomputing costs a no-grad forward of each group and rebuilding each version a step's groups
    claim (34-54% of the training time on the built-in model, docs/RESULTS.md section 6); a version
    no longer held keeps its sampler's claims. It pays where the claims sit far: at k3 3e-3 a token
    (emulated), GRPO on the claims ended 4.3 points below float32 samplers and on ours at their
    level. "auto" keeps the claims of samplers that compute as the learner does (float32) for free."""
    behaviour_auto_k3: float = 1e-8
    """"auto" recomputes the groups of a sampler whose claims sit further than this k3 per token
    (of log q/p) from the learner's own log-probs at the version they claim. It sits in the gap
    between rounding (a float32 engine on the same weights: 1e-13 to 1e-10) and the nearest
    low-precision engine (float16 on the built-in model, ~1e-6; bfloat16 3e-5 to 2e-4; a 151k
    vocabulary's 5e-3), so that no engine's estimate crosses it as training moves its entropy:
    where one did (a 1e-3 threshold at an emulated gap of ~1e-3), switching between claims and
    recomputation cost GRPO 2.5 +- 1.6 points against the claims alone and 4.2 +- 3.3 against
    recomputing alone, and recomputing never cost accuracy (docs/RESULTS.md section 6, "Where the
    gap starts to cost")."""
    rollout_is_cap: float = 2.0
    """Where the learner recomputed a group's behaviour log-probs ("learner", or "auto" for a sampler
    in another precision), weigh each token by p_ours / q_claimed, kept within [1 / cap, cap]:
    truncated importance sampling from the sampler's engine, which drew the token, to the learner's
    policy, which the loss's ratio is taken against (decoupled PPO; the rollout correction of verl
    and slime, their cap of 2). Without it the recomputed ratio treats the engine's draws as the
    learner's. It costs no compute (the claims are at hand), and forged claims move a token's
    weight by at most a factor of cap either way (past `max_logprob_gap` their group is dropped).
    Measured at emulated gaps of k3 1e-3 and 3e-3: the weights within 1% of 1, accuracy as without
    it (docs/RESULTS.md section 6). 0: off."""
    audit_first: int = 4
    """Own-model groups audited for checkable sampling (node/audit/margins.py) from each new sampler..."""
    audit_rate: float = 0.1
    """...and the share of its groups audited after those, chosen at random by the learner..."""
    audit_trusted_after: int = 32
    """...until it has passed this many audits; from then on, `audit_rate_trusted` of its groups.
    New keys are audited heavily, a long record lightly: one failed audit still refuses the sampler
    and revokes all its credit, so cheating on k groups is caught with probability
    1 - (1 - audit_rate_trusted)^k (k = 100: 95% at 3%)."""
    audit_rate_trusted: float = 0.03
    audit_margin: float = 1.0
    """The most, in logits, that an audited token's race score may fall short of the best one
    (node/checkable.race_margins) before its group fails. An honest engine's shortfall is its
    logit error at two scores, whatever the vocabulary: float32 engines ~1e-5, bfloat16 and
    float16 up to MEASURED (examples/bench_bf16_audit.py; docs/BENCHMARKS.md, "The audit across
    precisions"). An attacker may pick any token within it, so the per-sampler statistic below
    bounds how often."""
    audit_flip_rate: float = 0.06
    """The per-sampler statistic: the highest share of audited positions at which an honest
    engine's token is not the auditor's best (a flip, margin > node/audit.FLIP_MARGIN), measured
    over engines and precisions (bfloat16 flips near-ties). A sequential test of the sampler's
    flips against this rate refuses it once they are `audit_alarm`-unlikely for an honest engine."""
    audit_calibrate: bool = True
    """Hold samplers to the honest flip rate measured on this model instead (node/audit.FlipRate:
    audits also run their copy of the model under bfloat16 autocast, no extra memory; on every
    audit until 5,000 positions are measured, then on one in ten), with `audit_flip_rate` as its
    ceiling. That pass costs about half a float32 one on a GPU and 50-150x one on a CPU without
    bfloat16 units: where its 5,000 positions are estimated to take over 300 s (the model's size,
    the device's measured bfloat16 rate) it is skipped, with a warning, and `audit_flip_rate` holds."""
    audit_alarm: float = 1e-3
    """An honest sampler (flip rate <= audit_flip_rate) is refused by the statistic with at most
    this probability over its whole life (Ville's inequality: node/audit.FlipTest)."""
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
    checkpoint_every: int = 100
    """Checkpoint once this many versions have passed since the last checkpoint, or
    `checkpoint_interval_s` seconds, whichever comes first (0 turns this trigger off). A kill -9
    loses the versions since the last checkpoint, and the groups samplers made at them are then
    refused (`future_version`: the restarted chain never got there); this bounds that waste when
    steps are fast (the built-in model: ~0.3 s a step, so every ~30 s; its checkpoint, 11 MB,
    takes ~30 ms to write)."""
    checkpoint_interval_s: float = 600.0
    """...or once this many seconds have passed since the last (0: off), checked after each step:
    a kill -9 (OOM, power) loses at most this much training plus one step, whatever a step takes.
    Time, not only versions, because a real model's checkpoint is large: 1.5B parameters in
    float32 with AdamW's two moments, 12 bytes each, are ~18 GB, tens of seconds to write; at
    every version of a 30 s step that is as long as the step, every 10 minutes ~5%."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk; older ones are deleted (and folders a kill -9 left half written)."""
    weights: PublishConfig = field(default_factory=PublishConfig)
    """How versions go out: the view samplers run, lossless patches of it between keyframes, and how
    often (every N steps, seconds or an upload budget)."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The divergence guard (node/training/guard.py): the lr shrinks while the policy runs away from the
    rollouts it trains on (k3 per token above `kl_high`) and comes back once they agree again."""

    def __post_init__(self) -> None:
        for name, opts in ((self.stale_loss, self.stale_options), (self.foreign_loss, self.foreign_options)):
            if name != DROP:
                get_algorithm(name).make_config(opts)
        broken = [rule for rule, ok in _rules(self) if not ok]
        if broken:
            raise ValueError(f"learner: need {', '.join(broken)}")
        if any(not m or len(m) > 256 for m in self.accept_models):  # they go into the peer record (swarm/dht/records.py)
            raise ValueError("learner: accept_models entries must be model ids of 1-256 characters")


def _rules(c: LearnerConfig) -> list[tuple[str, bool]]:
    """Each bound on a value, as the error message states it, and whether `c` keeps it."""
    return [
        ("max_staleness >= 0", c.max_staleness >= 0), ("wait_staleness >= 0", c.wait_staleness >= 0),
        ("groups_per_step >= 1", c.groups_per_step >= 1), ("lr > 0", c.lr > 0),
        ("max_grad_norm > 0", c.max_grad_norm > 0),
        ("max_tokens_per_microbatch >= 0 (0: the whole step at once)", c.max_tokens_per_microbatch >= 0),
        ("eval_every >= 0", c.eval_every >= 0), ("eval_size >= 1", c.eval_size >= 1),
        ("max_buffer_groups >= 1", c.max_buffer_groups >= 1),
        ("behaviour_logprobs sampler, learner or auto", c.behaviour_logprobs in BEHAVIOUR_SOURCES),
        ("behaviour_auto_k3 > 0", c.behaviour_auto_k3 > 0),
        ("1 <= rollout_is_cap < inf (0: off)", c.rollout_is_cap == 0 or 1 <= c.rollout_is_cap < math.inf),
        ("max_logprob_gap > 0", c.max_logprob_gap > 0), ("audit_logprob_gap > 0", c.audit_logprob_gap > 0),
        ("audit_first >= 0", c.audit_first >= 0), ("0 <= audit_rate <= 1", 0 <= c.audit_rate <= 1),
        ("0 <= audit_rate_trusted <= 1", 0 <= c.audit_rate_trusted <= 1),
        ("audit_trusted_after >= audit_first", c.audit_trusted_after >= c.audit_first),
        ("audit_margin >= 0", c.audit_margin >= 0),
        ("0 < audit_flip_rate < 0.25", 0 < c.audit_flip_rate < 0.25),
        ("0 < audit_alarm < 1", 0 < c.audit_alarm < 1),
        ("0 <= foreign_step_share <= 1", 0 <= c.foreign_step_share <= 1),
        ("foreign_per_sampler >= 0", c.foreign_per_sampler >= 0),
        ("unaudited_per_step >= 0", c.unaudited_per_step >= 0),
        ("checkpoint_every >= 0 (0: off)", c.checkpoint_every >= 0),
        ("checkpoint_interval_s >= 0 (0: off)", c.checkpoint_interval_s >= 0),
        ("keep_checkpoints >= 1", c.keep_checkpoints >= 1),
    ]
