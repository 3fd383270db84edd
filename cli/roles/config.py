"""The config tree of `hetero-node join` (`JoinConfig`): the tables every command shares (task,
sampling, learner: node/), and what only a node on the real swarm reads (network, sampler, vllm).
It lives in cli/ because it is where node/ and swarm/ configs meet (node/ imports no swarm/ config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.config import SamplingConfig, TaskConfig
from node.device import check_spec
from node.engines import ENGINES
from node.engines.vllm import VLLMConfig
from node.learner import LearnerConfig
from node.models import BUILTIN_MODEL
from node.tasks import ArithmeticConfig
from swarm.delay import DelayConfig
from swarm.dht.network import NetworkConfig
from swarm.dht.validation import MAX_TTL
from swarm.weights import FetchConfig

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


@dataclass
class JoinConfig:
    role: str = "sampler"
    """sampler (generate rollouts), learner (train on them), or sampler,learner (both in one
    process on one device, taking turns and sharing the weights, as an RL Swarm node does)."""
    swarm: str = "demo"
    model: str = BUILTIN_MODEL
    workdir: str = ""
    """Identity key, outbox, journal, checkpoints and metrics; default ./hetero-node-<role>."""
    name: str = ""
    """Sampler: display name on the leaderboard (at most 64 characters; shown escaped)."""
    device: str = "auto"
    """auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N."""
    dtype: str = "auto"
    """Compute dtype: float32 or bfloat16; auto is bfloat16 on a GPU (a learner keeps float32 master
    weights; a sampler generates in bfloat16, which the learner's audit by race margin passes) and
    float32 on the CPU."""
    engine: str = "hf"
    """Sampler: 'hf' (transformers, anywhere) or 'vllm' (the vllm extra; settings in [vllm])."""
    follow: str | None = None
    """Learner peer id a sampler follows; default: the first learner found in the swarm."""
    nproc_per_node: int = 1
    """Learner: processes (GPUs) one learner trains on, with FSDP2 under torchrun; rank 0 is the
    swarm peer. `join` starts torchrun itself when this is > 1."""
    max_steps: int | None = None
    """Learner: stop (after a final eval and checkpoint) at this version."""
    seed: int = 0
    threads: int | None = None
    """torch CPU threads (default: $HETERO_NODE_THREADS, else torch's own choice)."""
    status_every_s: float = 30.0
    """Seconds between the one-line status reports in the log."""
    tally_every_s: float = 15.0
    """Learner: how often it publishes its per-sampler credit to the DHT (the leaderboard reads it)."""
    announce_every_s: float = 10.0
    peer_ttl_s: float = 30.0
    """PeerInfo records expire after this; a vanished peer is forgotten then."""
    tensorboard: bool = False
    """Learner: also write TensorBoard event files to <workdir>/tensorboard."""
    task: TaskConfig = field(default_factory=ArithmeticConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sampler: SamplerRoleConfig = field(default_factory=SamplerRoleConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {self.role!r}")
        check_spec(self.device, self.dtype)
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        if len(self.name) > 64:
            raise ValueError(f"name has {len(self.name)} characters; at most 64")
        if self.nproc_per_node < 1 or (self.nproc_per_node > 1 and self.role != "learner"):
            raise ValueError("nproc_per_node must be >= 1, and > 1 only for a learner (not sampler,learner: one device)")
        if self.role == "sampler,learner" and self.engine != "hf":
            raise ValueError("sampler,learner generates with the learner's own model in memory: engine must be hf")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("max_steps must be >= 1")
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
