"""The `[learner]` table (`LearnerConfig`): how rollouts are checked, corrected, trained on and
published, with a sub-table per concern: `[learner.audit]` (the spot audits), `[learner.behaviour]`
(whose log-probs the ratio is taken against), `[learner.foreign]` (other models' rollouts),
`[learner.checkpoint]`, `[learner.intake]` (what its door lets in: swarm/exchange.py `IntakeConfig`),
`[learner.weights]` (publishing) and `[learner.guard]`. What the learner trains (model, task,
sampling) lives in the top-level config, shared with the samplers. The keys these tables replaced
(`audit_first`, `stale_loss`, ...: `LearnerConfig.RENAMED`) still work, with a warning."""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any, ClassVar

from swarm.exchange import IntakeConfig

from node.algorithms import get_algorithm
from node.training.guard import GuardConfig
from node.weights.codec import PublishConfig

BEHAVIOUR_SOURCES = ("sampler", "learner", "auto")
"""`behaviour_logprobs`: the sampler's claims, the learner's recomputation (node/learner/behaviour.py),
or the recomputation for the samplers whose claims sit far (node/audit/claim_gaps.py)."""

DROP = "drop"
"""A route's loss that trains on nothing: its groups are refused at ingest (counted)."""


@dataclass(frozen=True)
class AuditConfig:
    """`[learner.audit]`: spot audits of own-model groups for checkable sampling (node/audit/)."""

    first: int = 4
    """Groups audited from each new sampler (all of them, until it has passed this many)..."""
    rate: float = 0.1
    """...and the share of its groups audited after those, chosen at random by the learner..."""
    established_after: int = 32
    """...until it has passed this many audits (it is *established*); from then on, `rate_established`
    of its groups. New keys are audited heavily, a long record lightly: one failed audit still refuses
    the sampler and revokes all its credit, so cheating on k groups is caught with probability
    1 - (1 - rate_established)^k (k = 100: 95% at 3%)."""
    rate_established: float = 0.03
    margin: float = 1.0
    """The most, in logits, that an audited token's race score may fall short of the best one
    (node/sampling/race.race_margins) before the position counts as an *exceedance*. An honest
    engine's shortfall is at most twice its logit error: float32 engines ~1e-5; on an H100,
    bfloat16 up to 0.62 and float16 up to 0.067 over 32k positions of a 151k-vocabulary 0.6B
    shape (examples/bench_bf16_audit.py; docs/BENCHMARKS.md, "The audit across precisions"). The
    error has a tail that depends on the model: honest bfloat16 samplers on builtin:tiny-chain-long
    fell 1.5 and 2.36 short in the replication's runs, when one such position refused a sampler
    for good (docs/RESULTS.md, "The cut" item 4), and a bfloat16 engine on that model as it trains
    passed 1 logit at 3 of 413k positions (examples/bench_margin_tail.py). So an exceedance is
    evidence for the sequential test at `exceed_rate`, not a verdict; an attacker may pick any
    token within `margin_hard`, and the two statistics bound how often."""
    margin_hard: float = 8.0
    """A token whose race score falls short of the best by more than this (logits), or that no
    engine within it could have let through top-k / top-p, fails its group and refuses its sampler
    at once. From the largest honest margin seen, 2.36 logits (a bfloat16 sampler in the
    replication's runs), and the largest logit error of a bfloat16 engine on that model's 20
    likeliest tokens, 1.62 over 413k positions as it trains (an honest margin is at most twice it,
    3.2; examples/bench_margin_tail.py): 8 is 2.5x that. Within it a cheat may pick any token that
    some engine within 8 logits could have kept, so what bounds it is the exceedance test: tokens
    past `margin` at up to about 2.2 x `exceed_rate` per audited position go unrefused
    (node/audit/flips.FlipTest), plus ~12 more that a long honest record can bank (the test's
    floor). Benchmarks of the
    audit alone may set it to `margin`."""
    exceed_rate: float = 3e-4
    """The exceedance test: the highest share of audited positions past `margin` for an honest
    engine. Measured: 3 of 413,373 positions (Wilson 95% upper 2.1e-5) for a bfloat16 engine on
    builtin:tiny-chain-long at versions 60-240 of a GRPO run (examples/bench_margin_tail.py); none
    of 32k on an H100's 0.6B shape (95% upper 1.2e-4, the least measured): 3e-4 is 2.5x the
    largest upper end. A sequential test of each sampler's exceedances against it
    (node/audit/flips.FlipTest, at `alarm` / 2) refuses a sampler once they are too many for an
    honest engine: one that edits a token past the margin in every group of 800 positions is
    refused at its 12th audited group (tests/unit/node/test_race.py, by hand). Not calibrated from
    the audit's bfloat16 reference pass: that pass runs under autocast, whose logit error is 2-5x
    smaller than a bfloat16 engine's at the tail."""
    flip_rate: float = 0.06
    """The per-sampler statistic: the highest share of audited positions at which an honest
    engine's token is not the auditor's best (a flip, margin > node/audit/margins.FLIP_MARGIN),
    measured over engines and precisions (bfloat16 flips near-ties). A sequential test of the
    sampler's flips against this rate refuses an honest engine with probability at most `alarm` / 2
    over its first million audited groups (node/audit/flips.FlipTest)."""
    calibrate: bool = True
    """Hold samplers to the honest flip rate measured on this model instead (node/audit/flips.FlipRate:
    audits also run their copy of the model under bfloat16 autocast, no extra memory), with
    `flip_rate` as its ceiling, measured only from what `budget` leaves: that pass costs about
    half a float32 one on a GPU and 50-150x one on a CPU without bfloat16 units, so on such a CPU
    it runs rarely and `flip_rate` holds until it has measured enough."""
    alarm: float = 1e-3
    """An honest sampler (flip rate <= flip_rate, exceedance rate <= exceed_rate) is refused by the
    two statistics with at most this probability over its first million audited groups (each at
    half of it; Ville's inequality with the tests' floor: node/audit/flips.FlipTest)."""
    budget: float = 0.02
    """What audits may cost, in seconds per second of training (node/audit/budget.py): spot audits
    at the rate that spends half of it (`rate` and `rate_established` are ceilings), new keys'
    first audits and the flip rate's measurement from the rest, while it lasts. `inf`: every audit
    the rates draw, whatever it costs (benchmarks of the audit itself)."""
    logprob_gap: float = 0.25
    """An audited group also fails if its claimed log-probs are further than this (mean |gap| per
    token) from ours at the very version it claims: honest engines are within 1e-5 in float32."""

    def __post_init__(self) -> None:
        _check("learner.audit", [
            ("first >= 0", self.first >= 0), ("0 <= rate <= 1", 0 <= self.rate <= 1),
            ("0 <= rate_established <= 1", 0 <= self.rate_established <= 1),
            ("established_after >= first", self.established_after >= self.first), ("margin >= 0", self.margin >= 0),
            ("margin <= margin_hard", self.margin <= self.margin_hard),
            ("0 < exceed_rate < 0.25", 0 < self.exceed_rate < 0.25),
            ("0 < flip_rate < 0.25", 0 < self.flip_rate < 0.25), ("0 < alarm < 1", 0 < self.alarm < 1),
            ("logprob_gap > 0", self.logprob_gap > 0), ("budget > 0", self.budget > 0)])


@dataclass(frozen=True)
class BehaviourConfig:
    """`[learner.behaviour]`: where own-model groups' behaviour log-probs (q of every loss's ratio p/q)
    come from, and how far a sampler's claims may sit from the learner's own."""

    source: str = "auto"
    """"sampler": as claimed (checked against ours within `max_logprob_gap`); "learner": recomputed
    by the learner's own forward at the published weights of the version each group claims
    (node/learner/behaviour.py), so that a sampler computing in another precision (bfloat16 on a GPU)
    or with other kernels makes no ratio differ from 1 on-policy; or "auto": recomputed for the
    samplers whose claims, measured by the audits and the recomputations, sit further than `auto_k3`
    from ours, and for those not measured yet (node/audit/claim_gaps.py). Recomputing costs a no-grad
    forward of each group and rebuilding each version a step's groups claim (34-54% of the training
    time on the built-in model, docs/RESULTS.md section 6); a version no longer held keeps its
    sampler's claims. It pays where the claims sit far: at k3 3e-3 a token (emulated), GRPO on the
    claims ended 4.3 points below float32 samplers and on ours at their level. "auto" keeps the
    claims of samplers that compute as the learner does (float32) for free."""
    auto_k3: float = 1e-8
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
    max_logprob_gap: float = 4.0
    """Own-model sequences whose claimed behaviour log-probs differ from the learner's own by more
    than this (mean |gap| per token, nats) are dropped from the step and counted against their
    sampler. Honest gaps come from staleness and engine numerics: at most 1.95-2.34 at 64 versions
    stale under the default gepo_lenclip (2.07 under GRPO; examples/bench_logprob_gap.py, two runs);
    a claim of -18/token is >= 11.9 away. What passes is still bounded by the dual clip (node/algorithms/base.py)."""

    def __post_init__(self) -> None:
        _check("learner.behaviour", [
            ("source sampler, learner or auto", self.source in BEHAVIOUR_SOURCES), ("auto_k3 > 0", self.auto_k3 > 0),
            ("1 <= rollout_is_cap < inf (0: off)", self.rollout_is_cap == 0 or 1 <= self.rollout_is_cap < math.inf),
            ("max_logprob_gap > 0", self.max_logprob_gap > 0)])


@dataclass(frozen=True)
class ForeignConfig:
    """`[learner.foreign]`: rollouts of other models (F-TIS corrects them: `LearnerConfig.foreign_loss`)."""

    accept_models: tuple[str, ...] = ("*",)
    """Foreign model ids whose rollouts are accepted; "*" accepts any (that shares our tokenizer,
    or whose tokenizer is in `tokenizers`). A model in our tokenizer is taken as foreign
    (unaudited, within the foreign share) only if named here; under any other id its rollouts
    are checked as our own (audits, gap check, version, staleness): a label proves nothing."""
    tokenizers: dict[str, str] = field(default_factory=dict)
    """Other models' tokenizers, model id -> a local tokenizer folder. Rollouts of a model with
    another tokenizer are taken only from these: the learner decodes their tokens and checks them
    against the text (text it cannot check would let a peer claim anything), then re-tokenizes."""
    step_share: float = 0.25
    """Foreign groups (never audited: unchecked work, not credited) fill at most this share of a
    step's groups (floor of share x groups_per_step), of a short step's too: a learner does not
    train on other models' rollouts alone unless this is 1 (node/learner/buffer.within_share).
    F-TIS bounds one step's damage, this a flood."""
    per_sampler: int = 2
    """...and at most this many of a step's groups come from one sampler's foreign groups."""

    def __post_init__(self) -> None:
        _check("learner.foreign", [("0 <= step_share <= 1", 0 <= self.step_share <= 1),
                                   ("per_sampler >= 0", self.per_sampler >= 0)])
        if any(not m or len(m) > 256 for m in self.accept_models):  # they go into the peer record (swarm/wire/peer.py)
            raise ValueError("learner.foreign: accept_models entries must be model ids of 1-256 characters")


@dataclass(frozen=True)
class CheckpointConfig:
    """`[learner.checkpoint]`: when the learner writes a checkpoint, and how many it keeps."""

    every: int = 100
    """Checkpoint once this many versions have passed since the last checkpoint, or `interval_s`
    seconds, whichever comes first (0 turns this trigger off). A kill -9 loses the versions since the
    last checkpoint, and the groups samplers made at them are then refused (`future_version`: the
    restarted chain never got there); this bounds that waste when steps are fast (the built-in model:
    ~0.3 s a step, so every ~30 s; its checkpoint, 11 MB, takes ~30 ms to write)."""
    interval_s: float = 600.0
    """...or once this many seconds have passed since the last (0: off), checked after each step:
    a kill -9 (OOM, power) loses at most this much training plus one step, whatever a step takes.
    Time, not only versions, because a real model's checkpoint is large: 1.5B parameters in
    float32 with AdamW's two moments, 12 bytes each, are ~18 GB, tens of seconds to write; at
    every version of a 30 s step that is as long as the step, every 10 minutes ~5%."""
    keep: int = 3
    """Checkpoints kept on disk; older ones are deleted (and folders a kill -9 left half written)."""

    def __post_init__(self) -> None:
        _check("learner.checkpoint", [("every >= 0 (0: off)", self.every >= 0),
                                      ("interval_s >= 0 (0: off)", self.interval_s >= 0), ("keep >= 1", self.keep >= 1)])


@dataclass
class LearnerConfig:
    """The `[learner]` table."""

    own_loss: str = "gepo_lenclip"
    """Loss for rollouts of our own model (any version): gepo_lenclip, gepo, grpo, dr_grpo, gspo, m2po,
    pg or drop. `gepo_lenclip` by the protocol's evidence (docs/RESULTS.md, "At a glance"): above GRPO
    under a pinned lag of 32 and 128 versions, non-inferior on-policy and in the demo at T 1.0."""
    own_options: dict[str, Any] = field(default_factory=dict)
    """Fields of that loss's config, e.g. {eps = 0.2, beta = 0.005} for GEPO."""
    foreign_loss: str = "ftis"
    """Loss for rollouts of other models: ftis, pg, grpo, ... or drop."""
    foreign_options: dict[str, Any] = field(default_factory=dict)
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
    max_buffer_groups: int = 4096
    """Bound on accepted-but-untrained groups; beyond it new records are refused (counted), so
    memory stays bounded without dropping anything already accepted."""
    unaudited_per_step: int = 2
    """Groups of a step from samplers not yet proven (`is_proven`) whose version the learner cannot
    rebuild to audit (an earlier run's chain), all such samplers together: such a key is never
    audited, so it is trained on only this much (and not credited). A restart opens no window."""
    audit: AuditConfig = field(default_factory=AuditConfig)
    behaviour: BehaviourConfig = field(default_factory=BehaviourConfig)
    foreign: ForeignConfig = field(default_factory=ForeignConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    intake: IntakeConfig = field(default_factory=IntakeConfig)
    """What the learner's door reads, checks and journals per sampler, and for all unproven keys
    together (`[learner.intake]`: quota, rate, byte_rate, journal_bytes and their unproven_ pool)."""
    weights: PublishConfig = field(default_factory=PublishConfig)
    """How versions go out: the view samplers run, lossless patches of it between keyframes, and how
    often (every N steps, seconds or an upload budget)."""
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The divergence guard (node/training/guard.py): the lr shrinks while the policy runs away from the
    rollouts it trains on (k3 per token above `kl_high`) and comes back once they agree again."""

    RENAMED: ClassVar[dict[str, str]] = {
        "stale_loss": "own_loss", "stale_options": "own_options",
        **{f"audit_{k}": f"audit.{k}" for k in ("first", "rate", "margin", "flip_rate", "calibrate", "alarm", "logprob_gap")},
        "audit_trusted_after": "audit.established_after", "audit_rate_trusted": "audit.rate_established",
        "behaviour_logprobs": "behaviour.source", "behaviour_auto_k3": "behaviour.auto_k3",
        "rollout_is_cap": "behaviour.rollout_is_cap", "max_logprob_gap": "behaviour.max_logprob_gap",
        "accept_models": "foreign.accept_models", "foreign_tokenizers": "foreign.tokenizers",
        "foreign_step_share": "foreign.step_share", "foreign_per_sampler": "foreign.per_sampler",
        "checkpoint_every": "checkpoint.every", "checkpoint_interval_s": "checkpoint.interval_s",
        "keep_checkpoints": "checkpoint.keep"}
    """Keys of `[learner]` that moved (old key -> its place now): a file or flag that uses one still
    works, and the loader says what to write instead (node/config.py)."""

    def __post_init__(self) -> None:
        for name, opts in ((self.own_loss, self.own_options), (self.foreign_loss, self.foreign_options)):
            if name != DROP:
                get_algorithm(name).make_config(opts)
        _check("learner", [
            ("max_staleness >= 0", self.max_staleness >= 0), ("wait_staleness >= 0", self.wait_staleness >= 0),
            ("groups_per_step >= 1", self.groups_per_step >= 1), ("lr > 0", self.lr > 0),
            ("max_grad_norm > 0", self.max_grad_norm > 0),
            ("max_tokens_per_microbatch >= 0 (0: the whole step at once)", self.max_tokens_per_microbatch >= 0),
            ("eval_every >= 0", self.eval_every >= 0), ("eval_size >= 1", self.eval_size >= 1),
            ("max_buffer_groups >= 1", self.max_buffer_groups >= 1),
            ("unaudited_per_step >= 0", self.unaudited_per_step >= 0)])


def _check(table: str, rules: list[tuple[str, bool]]) -> None:
    """Each bound on a value, as the error message states it, and whether it is kept."""
    broken = [rule for rule, ok in rules if not ok]
    if broken:
        raise ValueError(f"{table}: need {', '.join(broken)}")
