"""Each command's config: one tree, the same blocks in every root (node/config.py, node/tables.py),
each field declared once with one default.

    local      node.local.LocalConfig    = model, process, run, tables
    simulate   SimulatorConfig           = model, process, run, tables + the virtual samplers and clock
    join       JoinConfig                = model, process, tables + role, network, [sampler], [vllm]

The roots of `simulate` and `join` live here because they meet swarm/'s configs (delays, the
network, weight fetching), which node/ does not import; `local`'s is node/'s own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.config import ModelBlock, ProcessBlock, RunBlock
from node.engines import ENGINES
from node.engines.vllm import VLLMConfig
from node.local import LocalConfig
from node.tables import TablesBlock
from swarm.delay import DelayConfig
from swarm.dht.network import NetworkConfig
from swarm.dht.validation import MAX_TTL
from swarm.weights import FetchConfig
from swarm.wire.peer import MAX_DISPLAY_NAME

__all__ = ["ROLES", "JoinConfig", "LocalConfig", "SamplerRoleConfig", "SimSamplerSpec", "SimulatorConfig"]


@dataclass(frozen=True)
class SimSamplerSpec:
    """One `[[samplers]]` entry: `count` virtual samplers alike."""

    name: str = "sampler"
    model: str = ""
    """Model they serve; "" = the learner's. Another model's rollouts are foreign (F-TIS)."""
    count: int = 1
    share: float = 1.0
    """Relative rollout rate: a sampler with share 2 makes twice the groups of one with share 1."""
    weight_delay: DelayConfig = field(default_factory=DelayConfig)
    rollout_delay: DelayConfig = field(default_factory=DelayConfig)
    dtype: str = "float32"
    """The precision their engine computes in: "bfloat16" is a GPU volunteer's sampler (behaviour
    log-probs from another precision than the learner's)."""
    matmul: str = "float32"
    """How a bfloat16 or float16 engine on a CPU multiplies: "float32" (each linear layer's product
    in float32, rounded once to the dtype: a GPU's bf16 GEMM accumulates in float32 too) or "native"
    (torch's CPU kernel for the dtype, 3.2x slower to generate with on a CPU without AVX512-BF16;
    `cli.simulate.Float32Linear` says how the two differ). On a GPU, always the native kernel."""
    logit_error: float = 0.0
    """Standard deviation (logits) of Gaussian noise added to every logit their engine computes, at
    every position: an emulated engine error. A small model in bfloat16 errs far less than a large
    one (the behaviour log-probs' k3 against the learner's: ~1e-4 on the built-in model, ~5e-3 on a
    151k-vocabulary model in bfloat16, docs/BENCHMARKS.md), so this gives a small model a large
    one's gap, to ask on a CPU what that gap does to training. 0.3 on the built-in chain model at
    T = 0.6: k3 ~3e-3 a token, 1.2% of tokens past GRPO's clip (docs/RESULTS.md, section 6)."""

    def __post_init__(self) -> None:
        if self.count < 1 or self.share <= 0:
            raise ValueError("samplers: need count >= 1 and share > 0")
        if not 0 <= self.logit_error < 10:
            raise ValueError(f"samplers: logit_error {self.logit_error} is not in [0, 10) logits")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"samplers: dtype {self.dtype!r} is not float32, bfloat16 or float16")
        if self.matmul not in ("float32", "native"):
            raise ValueError(f"samplers: matmul {self.matmul!r} is not float32 or native")


@dataclass(kw_only=True)
class SimulatorConfig(TablesBlock, RunBlock, ProcessBlock, ModelBlock):
    """`hetero-node simulate`: the shared blocks (the learner and every sampler's engine run on
    `device`, the learner computes in `dtype`), and the virtual samplers and clock."""

    samplers: tuple[SimSamplerSpec, ...] = (SimSamplerSpec(count=2),)
    seconds_per_step: float = 30.0
    """Virtual seconds per learner step: maps delays in seconds to staleness in steps."""
    max_delay_steps: int | None = None
    """The paper's 'max delay': caps every weight delay at this many learner steps (0 = online)."""
    max_ticks_factor: float = 3.0
    """Give up after steps * this many ticks without enough data (rollout delays can starve)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.samplers:
            raise ValueError("simulator: give at least one sampler in [[samplers]]")
        if self.seconds_per_step <= 0:
            raise ValueError("simulator: need seconds_per_step > 0")
        if self.max_delay_steps is not None and self.max_delay_steps < 0:
            raise ValueError(f"max_delay_steps must be >= 0 (0 = online), not {self.max_delay_steps}")


ROLES = ("sampler", "learner", "sampler,learner")
"""sampler,learner: both in one process on one device, sharing the weights (cli/roles/both.py)."""


@dataclass(frozen=True)
class SamplerRoleConfig:
    """The `[sampler]` table: how a sampler paces itself and what WAN delay it injects."""

    prompts_per_batch: int = 8
    """Prompts per generation batch (each gets sampling.group_size completions)."""
    max_outbox: int = 256
    """Pause generating while this many rollouts wait undelivered (learner away)."""
    max_learner_backlog: int = 32
    """Pause while the learner holds this many untrained groups, so that samplers do not run
    ahead of the learner and feed it ever staler rollouts (an async level bound)."""
    weight_delay: DelayConfig = field(default_factory=DelayConfig)
    """Injected delay before loading newer weights (docs/DESIGN.md, "Delay")."""
    rollout_delay: DelayConfig = field(default_factory=DelayConfig)
    """Injected delay before each rollout is sent."""
    fetch: FetchConfig = field(default_factory=FetchConfig)
    """How long a weight source may stall before the sampler asks the next (swarm/weights/config.py)."""

    def __post_init__(self) -> None:
        if self.prompts_per_batch < 1 or self.max_outbox < 1 or self.max_learner_backlog < 1:
            raise ValueError("sampler: prompts_per_batch, max_outbox and max_learner_backlog must be >= 1")


@dataclass(kw_only=True)
class JoinConfig(TablesBlock, ProcessBlock, ModelBlock):
    """`hetero-node join`: the shared blocks, and what only a node on the real swarm reads."""

    role: str = "sampler"
    """sampler (generate rollouts), learner (train on them), or sampler,learner (both in one
    process on one device, taking turns and sharing the weights, as an RL Swarm node does)."""
    swarm: str = "demo"
    workdir: str = ""
    """Identity key, outbox, journal, checkpoints and metrics; default ./hetero-node-<role>."""
    name: str = ""
    """Sampler: display name on the leaderboard (at most 64 characters; shown escaped)."""
    engine: str = "hf"
    """Sampler: 'hf' (transformers, anywhere) or 'vllm' (the vllm extra; settings in [vllm])."""
    follow: str | None = None
    """Learner peer id a sampler follows; default: the first learner found in the swarm."""
    nproc_per_node: int = 1
    """Learner: processes (GPUs) one learner trains on, with FSDP2 under torchrun; rank 0 is the
    swarm peer. `join` starts torchrun itself when this is > 1."""
    max_steps: int | None = None
    """Learner: stop (after a final eval and checkpoint) at this version."""
    status_every_s: float = 30.0
    """Seconds between the one-line status reports in the log."""
    tally_every_s: float = 15.0
    """Learner: how often it publishes its per-sampler credit to the DHT (the leaderboard reads it)."""
    announce_every_s: float = 10.0
    peer_ttl_s: float = 30.0
    """PeerInfo records expire after this; a vanished peer is forgotten then."""
    tensorboard: bool = False
    """Learner: also write TensorBoard event files to <workdir>/tensorboard."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    sampler: SamplerRoleConfig = field(default_factory=SamplerRoleConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if len(self.name) > MAX_DISPLAY_NAME:
            raise ValueError(f"name has {len(self.name)} characters; at most {MAX_DISPLAY_NAME}")
        if self.nproc_per_node < 1 or (self.nproc_per_node > 1 and self.role != "learner"):
            raise ValueError("nproc_per_node must be >= 1, and > 1 only for a learner (not sampler,learner: one device)")
        if self.role == "sampler,learner" and self.engine != "hf":
            raise ValueError("sampler,learner generates with the learner's own model in memory: engine must be hf")
        if self.engine == "vllm":
            from node.engines.vllm_settings import check_vllm_config

            check_vllm_config(self.vllm, self.sampling, self.dtype)
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
        if self.follow is not None:
            from swarm.identity import check_peer_id

            check_peer_id(self.follow, "follow")
        if min(self.status_every_s, self.tally_every_s, self.announce_every_s, self.peer_ttl_s) <= 0:
            raise ValueError("status_every_s, tally_every_s, announce_every_s and peer_ttl_s must be > 0")
        if self.peer_ttl_s > MAX_TTL:
            raise ValueError(f"peer_ttl_s is {self.peer_ttl_s:g}; at most {MAX_TTL:g} (the DHT refuses records living longer)")
        self.workdir = self.workdir or f"hetero-node-{self.role.replace(',', '-')}"

    @property
    def identity_path(self) -> Path:
        return Path(self.workdir) / "identity.key"

    @property
    def learns(self) -> bool:
        return self.role in ("learner", "sampler,learner")
