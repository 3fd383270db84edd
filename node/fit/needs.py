"""What each role holds, per parameter and per token: the one place this arithmetic lives.

    needs(Role.LEARNER, "hf", shape, work) -> Needs(gpu=..., host=..., disk=...)

Every figure is a constant below with where it comes from: a measurement (docs/BENCHMARKS.md, "The
first swarm at real size" and "What fits on a GPU"), or what a tensor is (4 bytes a float32
parameter). The README's table (`node.fit.table`), `hetero-node doctor`, join's preflight and the
vLLM engine's automatic settings (node/engines/vllm_settings.py) all read them from here.

GPU, a learner on one GPU: 16 bytes a parameter (float32 weights, gradients, AdamW's two moments) +
its published view (2 in bfloat16) + the activations of one micro-batch (`[learner]
max_tokens_per_microbatch` tokens) + the output head's chunks + the CUDA runtime; or, during
AdamW's step (activations freed), the same state + its temporary. Under FSDP2 over N ranks the 16
bytes are split, but rank 0 also keeps an unsharded float32 copy and, in audits, the audit copy.
A sampler: its weights in the compute dtype + the KV cache of one batch (prompts_per_batch x
group_size sequences of prompt + max_new_tokens) + its engine's workspace + the runtime.

Host RAM beside a GPU: a learner keeps the audit archive's rebuilt view, the keyframe it serves and,
while it audits a sampler still at version 0, the base model from its folder; a sampler its view,
a second one while a keyframe decodes, and the keyframe it serves its mates. Each node also has a
runtime (Python, torch, its DHT process, p2pd). On the CPU all of it is in RAM, times what the
rehearsal measured over this arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from node.engines.hf import MAX_BATCH
from node.fit.shape import DTYPE_BYTES, QWEN3, ModelShape
from node.training.logprobs import HEAD_CHUNK_BYTES

GIB = 1 << 30


class Role(str, Enum):
    SAMPLER = "sampler"
    LEARNER = "learner"
    BOTH = "sampler,learner"
    """A learner and a sampler in one process on one device, sharing the weights (cli/roles/both.py)."""


# ---- the learner, on its GPU (or in RAM on a CPU) ----------------------------------------------
TRAIN_STATE_BYTES = 16
"""A trained parameter: float32 weight (4), its gradient (4) and AdamW's two moments (8)."""
OPTIMIZER_TEMP_BYTES = 4
"""torch's AdamW (foreach, the default on CUDA) takes sqrt(v) of every parameter at once: a float32
temporary of the weights' size during `optimizer.step()`, when the activations are already freed."""
HEAD_WORKSPACE = 3 * HEAD_CHUNK_BYTES
"""The output head's float32 logits are computed in chunks (node/training/logprobs.py); in a chunk's
backward its logits, their log-softmax and its gradient exist at once (examples/rehearsal.py)."""

MEASURED_PEAK = 19.7 * GIB
"""`examples/bench_learner.py --shape qwen3-0.6b --device cuda --dtype bfloat16 --groups 8
--completion-len 512 --budget 8192` on an H100 (docs/BENCHMARKS.md): the learner step's peak *above*
what it held when the step began (its `PeakMemory`: weights, gradients and AdamW's state, left by the
warm-up step). So 19.7 GiB is a micro-batch's activations and the head's chunks, not the total."""
MEASURED_TOKENS = 14 * (64 + 512)
"""That micro-batch: 14 rows of 64 prompt + 512 completion tokens fill the 8,192-token budget."""
MEASURED_SHAPE = ModelShape.from_config(QWEN3["Qwen/Qwen3-0.6B"], "Qwen/Qwen3-0.6B")
ACTIVATION_BYTES = {"float32": 4.0}
"""Bytes a training forward saves per value of `ModelShape.activation_values` (per token and layer).
float32: 4 (examples/rehearsal.py's count; the rehearsal's learner peaked at 1.26x that arithmetic)."""
ACTIVATION_BYTES["bfloat16"] = ACTIVATION_BYTES["float16"] = (MEASURED_PEAK - HEAD_WORKSPACE) / (
    MEASURED_TOKENS * MEASURED_SHAPE.layers * MEASURED_SHAPE.activation_values)
"""Under autocast, from the H100 measurement: 3.67 bytes a value, hardly less than float32 (the
residual stream and the norms stay float32; the matmuls save bfloat16 copies of their inputs)."""
CHECKPOINTED_BYTES = 4
"""With gradient checkpointing a layer keeps only its input, the float32 residual stream (hidden
values), and recomputes the rest in backward, one layer at a time."""
GPU_RUNTIME = 1 * GIB
"""CUDA's context (~0.5 GiB) and the caching allocator's slack that max_memory_allocated does not
count: an allowance, not measured here."""
RANK0_COPIES_BYTES = 8
"""FSDP2's rank 0 keeps an unsharded float32 copy (evaluation, publishing) and, in audits, the audit
copy (docs/BENCHMARKS.md, "What fits on a GPU")."""
GATHERED_LAYERS = 2
"""FSDP2 all-gathers one layer's float32 weights around its forward and backward, and prefetches
the next."""

# ---- the sampler's engine -----------------------------------------------------------------------
HF_LOGIT_COPIES = 3
"""The HF engine's step over a batch's rows: float32 logits, the tempered copy and the picker's race."""
VLLM_BLOCK_TOKENS = 16
"""vLLM allocates KV in blocks of 16 tokens: each sequence's last block may be partly empty."""
VLLM_LARGE_GPU = 70 * GIB
VLLM_PROFILE = {False: (8192, 256), True: (16384, 1024)}
"""vLLM's defaults for the LLM class (max_num_batched_tokens, max_num_seqs), by whether the GPU has
`VLLM_LARGE_GPU` or more: its start-up profile pushes that many tokens through the model and samples
that many rows, and keeps the peak out of the KV cache."""
VLLM_MAX_UTILIZATION = 0.9
"""The most of a GPU's memory vLLM is given (its own default): the rest for what no profile sees."""

# ---- host RAM, beside a GPU and on the CPU ------------------------------------------------------
NODE_RUNTIME = 0.65 * GIB
"""A node before any model: Python, torch, its DHT process and p2pd (the rehearsal's bootstrap peak)."""
KEYFRAME_OF_VIEW = {"bfloat16": 0.71, "float16": 0.71, "float32": 1.0}
"""A keyframe blob's bytes over its view's: zstd of a bfloat16 view's byte planes, 311 of 438 MB in
the rehearsal (random weights); a float32 view's does not shrink (examples/rehearsal.py)."""
BASE_MODEL_BYTES = 4
"""A GPU learner loads the base model in float32 from its folder into RAM while it audits a sampler
still at version 0 (docs/BENCHMARKS.md: "4, briefly"): it counts at the peak."""
CPU_FACTOR = 1.3
"""On the CPU, the rehearsal's peaks were 1.26x (learner) and 1.25-1.32x (samplers) this arithmetic
(glibc's heap, tied embeddings' two gradients; docs/BENCHMARKS.md, "The first swarm at real size")."""

# ---- disk, where the workdir is -----------------------------------------------------------------
CHECKPOINT_BYTES = 12
"""A learner checkpoint: float32 weights and AdamW's two moments; `keep` of them + one being written."""
WORKDIR_BYTES = 1 * GIB
"""Outbox, journal, metrics and logs: an allowance."""


@dataclass(frozen=True)
class Workload:
    """What a node runs, as far as memory goes (cli/doctor.py builds one from a join's config)."""

    device: str
    """cuda or cpu: where the role's tensors live."""
    dtype: str
    """Compute dtype: float32, bfloat16 or float16."""
    view: str
    """The published view's dtype (`[learner.weights] view`): what samplers hold and keyframes carry."""
    microbatch_tokens: int
    """`[learner] max_tokens_per_microbatch` (0: a whole step at once; counted as `step_tokens`)."""
    checkpointing: bool
    ranks: int
    """Learner: GPUs it trains on with FSDP2 (`nproc_per_node`)."""
    checkpoints_kept: int
    prompts_per_batch: int
    """Sampler: `[sampler] prompts_per_batch`."""
    group_size: int
    """`[sampling] group_size`: completions a prompt."""
    prompt_tokens: int
    """The longest prompt's tokens."""
    new_tokens: int
    """`[sampling] max_new_tokens`."""
    step_tokens: int = 0
    """A step's tokens, for `microbatch_tokens` = 0 (groups_per_step x group_size x sequence)."""
    recompute_copy: bool = False
    """vLLM with `[vllm] logprobs = "recompute"`: an HF copy of the weights in float32 in RAM."""
    cpu_kv_cache_gib: float = 1.0
    """vLLM on the CPU: the KV space it allocates whole (`[vllm] cpu_kv_cache_gib`)."""

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    @property
    def sequences(self) -> int:
        """Sequences of a generation batch."""
        return self.prompts_per_batch * self.group_size

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.new_tokens

    @property
    def train_tokens(self) -> int:
        """Tokens of one forward/backward: the budget, or a whole step where it is smaller (known)."""
        return min((t for t in (self.microbatch_tokens, self.step_tokens) if t), default=0)


@dataclass(frozen=True)
class Needs:
    """Bytes a role needs at its peak: on each GPU it uses (0 on the CPU), in RAM and on the disk."""

    gpu: int
    host: int
    disk: int
    gpus: int
    """GPUs it uses (0: the CPU)."""
    gpu_parts: tuple[tuple[str, int], ...] = ()
    host_parts: tuple[tuple[str, int], ...] = ()
    """Where the bytes go, (what, bytes): for a user reading why."""


def needs(role: Role | str, engine: str, shape: ModelShape, work: Workload, gpu_total: int | None = None) -> Needs:
    """What `role` with `engine` needs for `shape` and `work`. `gpu_total`: the GPU's memory, which
    sets the size of vLLM's start-up profile (`VLLM_PROFILE`)."""
    role = Role(role)
    learner = role in (Role.LEARNER, Role.BOTH)
    dev = _learner_parts(shape, work) if learner else _sampler_parts(engine, shape, work, gpu_total)
    if role is Role.BOTH:  # generation on the learner's own model: its KV cache and logits on top
        dev += _hf_generation(shape, work)
    disk = WORKDIR_BYTES + (int((work.checkpoints_kept + 1) * CHECKPOINT_BYTES * shape.parameters) if learner else 0)
    if work.on_gpu:
        host = _learner_host(shape, work, base_model=True) if learner else _sampler_host(shape, work)
        return Needs(sum(b for _, b in dev) + GPU_RUNTIME, sum(b for _, b in host), disk, work.ranks if learner else 1,
                     (*dev, ("CUDA runtime", GPU_RUNTIME)), tuple(host))
    # the CPU: the GPU's share in RAM too, times what the rehearsal measured over this arithmetic
    # (which covers a learner's brief copy of the base model: its version-1 audits loaded it)
    ram = dev + (_learner_host(shape, work, base_model=False) if learner else _sampler_host(shape, work))
    counted = sum(b for _, b in ram)
    return Needs(0, int(CPU_FACTOR * counted), disk, 0, (),
                 (*ram, (f"x{CPU_FACTOR} as measured on the CPU", int((CPU_FACTOR - 1) * counted))))


def activation_bytes(shape: ModelShape, work: Workload, tokens: int | None = None) -> int:
    """One micro-batch's saved activations (`tokens`: default the workload's budget)."""
    tokens = work.train_tokens if tokens is None else tokens
    per_value = ACTIVATION_BYTES[work.dtype]
    if work.checkpointing:  # each layer's input, + one layer's whole activations while it is recomputed
        per_token = CHECKPOINTED_BYTES * shape.hidden * shape.layers + per_value * shape.activation_values
    else:
        per_token = per_value * shape.activation_values * shape.layers
    return int(tokens * per_token)


def _learner_parts(shape: ModelShape, work: Workload) -> list[tuple[str, int]]:
    """The learner's device memory at its peak (a micro-batch's backward, or AdamW's step)."""
    p, n = shape.parameters, work.ranks
    view = ("published view", p * DTYPE_BYTES[work.view])
    if n == 1:
        state = [("float32 weights, gradients, AdamW", TRAIN_STATE_BYTES * p), view]
    else:
        state = [(f"1/{n} of float32 weights, gradients, AdamW", TRAIN_STATE_BYTES * p // n), view,
                 ("rank 0: unsharded float32 copy and audit copy", RANK0_COPIES_BYTES * p),
                 ("all-gathered layers", GATHERED_LAYERS * shape.layer_parameters * 4)]
    step = [("activations of " + f"{work.train_tokens:,} tokens" + (" (checkpointed)" if work.checkpointing else ""),
             activation_bytes(shape, work)), ("output head's chunks", HEAD_WORKSPACE)]
    optimizer = [("AdamW step's temporary", OPTIMIZER_TEMP_BYTES * p // n)]
    return state + max(step, optimizer, key=lambda parts: sum(b for _, b in parts))


def _sampler_parts(engine: str, shape: ModelShape, work: Workload, gpu_total: int | None) -> list[tuple[str, int]]:
    weights = ("weights", shape.weight_bytes(work.dtype))
    if engine == "vllm":
        if not work.on_gpu:  # vLLM's CPU backend allocates its KV space whole
            return [weights, ("KV cache space", int(work.cpu_kv_cache_gib * GIB))]
        tokens = work.sequences * VLLM_BLOCK_TOKENS * math.ceil(work.sequence_tokens / VLLM_BLOCK_TOKENS)
        return [weights, (f"KV cache of {work.sequences} x {work.sequence_tokens:,} tokens",
                          tokens * shape.kv_bytes_per_token(work.dtype)),
                ("vLLM's start-up profile", vllm_profile_bytes(shape, work.dtype, gpu_total))]
    return [weights, *_hf_generation(shape, work)]


def _hf_generation(shape: ModelShape, work: Workload) -> list[tuple[str, int]]:
    """The HF engine's KV cache and logits: at most MAX_BATCH rows (whole groups) a generate call."""
    rows = min(work.sequences, max(work.group_size, MAX_BATCH // work.group_size * work.group_size))
    return [(f"KV cache of {rows} x {work.sequence_tokens:,} tokens",
             rows * work.sequence_tokens * shape.kv_bytes_per_token(work.dtype)),
            ("logits of a step", rows * shape.vocab * 4 * HF_LOGIT_COPIES)]


def vllm_profile_bytes(shape: ModelShape, dtype: str, gpu_total: int | None) -> int:
    """The peak of vLLM's start-up profile: its token budget through the widest tensors of a layer
    (the residual, normed, attention and gated-MLP values, ~4 h + 3 f a token) and its row budget's
    float32 logits and probabilities."""
    tokens, rows = VLLM_PROFILE[gpu_total is not None and gpu_total >= VLLM_LARGE_GPU]
    return tokens * (4 * shape.hidden + 3 * shape.intermediate) * DTYPE_BYTES[dtype] + rows * shape.vocab * 4 * 2


def _keyframe(shape: ModelShape, view: str) -> int:
    return int(KEYFRAME_OF_VIEW[view] * shape.weight_bytes(view))


def _learner_host(shape: ModelShape, work: Workload, base_model: bool) -> list[tuple[str, int]]:
    """A learner's RAM beyond its device's; `base_model`: with the brief copy a version-0 audit loads."""
    parts = [("audit archive's view", shape.weight_bytes(work.view)),
             ("keyframe it serves", _keyframe(shape, work.view))]
    if base_model:
        parts.append(("base model for version-0 audits", BASE_MODEL_BYTES * shape.parameters))
    if work.ranks > 1:  # every rank loads the whole model into RAM before sharding it (node/training/distributed.py)
        loads = work.ranks * 4 * shape.parameters
        if loads > sum(b for _, b in parts):
            parts = [(f"{work.ranks} ranks loading the model before sharding", loads)]
        parts.append((f"{work.ranks - 1} more ranks' runtime", int((work.ranks - 1) * NODE_RUNTIME)))
    return parts + [("node runtime", int(NODE_RUNTIME))]


def _sampler_host(shape: ModelShape, work: Workload) -> list[tuple[str, int]]:
    parts = [("its view, and a second while a keyframe decodes", 2 * shape.weight_bytes(work.view)),
             ("keyframe it serves", _keyframe(shape, work.view)), ("node runtime", int(NODE_RUNTIME))]
    if work.recompute_copy:
        parts.append(("float32 copy for [vllm] logprobs = recompute", 4 * shape.parameters))
    return parts
