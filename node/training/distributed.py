"""A learner over several processes: PyTorch's FSDP2 (`fully_shard`) launched by `torchrun`.

    torchrun --nproc-per-node N ...      every rank: init_from_env, load the model, shard it
      rank 0    the real learner (DHT, RPC, publishing); it trains through a `Leader`
      ranks > 0 `follow(...)`: do what rank 0 broadcasts (a step, a state gather, a load) until "stop"

The step itself is `node.training.step.train_step(..., dist=collective)`, which every rank calls with the
same parts: micro-batches are dealt round-robin over ranks, FSDP2 all-gathers each layer's weights
around its forward/backward and reduce-scatters its gradients, so every rank holds and updates a
1/N shard of the float32 weights and of AdamW's state. CPU runs on gloo
(tests/integration/node/test_distributed_ranks.py trains 2 ranks and compares them with 1 process),
CUDA on NCCL.

Two process groups: the default one carries the step's collectives and fails after `timeout`;
rank 0's commands travel on a gloo group of their own with a long `idle_timeout`, because a
follower may wait as long as the learner waits for rollouts. (A rank that dies makes torchrun stop
the others; under FSDP a step that fails on one rank is fatal to the job, not retried.)

State: `full_state_dict` / `optimizer_state` gather full tensors onto rank 0's CPU with the key
names of the unwrapped HF model (as `model.state_dict()` in one process, tied weights sharing one
tensor), `load_full_state` loads such a state on rank 0 and shards it out to every rank.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Sequence

import torch
import torch.distributed as dist

from node.training.logprobs import CompletionLogprobs
from node.training.step import StepOptions, train_step
from node.training.batch import TrainPart

log = logging.getLogger(__name__)

STEP_TIMEOUT = timedelta(minutes=10)
"""Longest wait for one collective of a step (an all-gather, a reduce-scatter, a state gather)."""
IDLE_TIMEOUT = timedelta(hours=24)
"""Longest a follower waits for rank 0's next command (the learner may wait long for rollouts)."""
_PREFIX = "lm."
"""Key prefix of the wrapper (CompletionLogprobs.lm) that state dicts drop and loaders add back."""


@dataclass
class TorchCollective:
    """node.training.step.Collective over torch.distributed's default group, plus the command channel."""

    rank: int
    world: int
    device: torch.device
    """This rank's device (cuda:LOCAL_RANK on GPUs)."""
    control: Any = field(default=None, repr=False)
    """The gloo group rank 0's commands travel on (IDLE_TIMEOUT); None: the default group."""

    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """`obj` of rank `src` on every rank (pickled, over the command group: the ranks of one
        torchrun job trust each other; nothing from the swarm travels here unchecked)."""
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self.control)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_from_env(device: str = "cpu", timeout: timedelta = STEP_TIMEOUT,
                  idle_timeout: timedelta = IDLE_TIMEOUT) -> TorchCollective | None:
    """The process group torchrun describes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR/PORT in the
    environment), or None for a single process. `device`: "cpu" (gloo) or "cuda"/"cuda:N" (NCCL;
    each rank takes cuda:LOCAL_RANK, whatever N says)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.device(device).type == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", timeout=timeout, device_id=dev)
    elif torch.device(device).type == "cpu":
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    else:
        raise ValueError(f"distributed learner: device must be cpu or cuda, not {device!r}")
    control = dist.new_group(backend="gloo", timeout=idle_timeout)
    log.info("rank %d of %d on %s", rank, world, dev)
    return TorchCollective(rank, world, dev, control)


# ---- sharding ----------------------------------------------------------------------------------

def decoder_layers(lm: torch.nn.Module) -> Sequence[torch.nn.Module]:
    """The transformer blocks of a HF causal LM (Qwen, Llama, Mistral, Gemma: `base_model.layers`)."""
    layers = getattr(getattr(lm, "base_model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"cannot shard {type(lm).__name__}: no decoder layers at .base_model.layers "
                         "(FSDP here supports Qwen/Llama-style Hugging Face causal LMs)")
    return layers


def shard(lm: torch.nn.Module, mesh: Any = None, param_dtype: torch.dtype | None = None) -> CompletionLogprobs:
    """`lm` sharded with FSDP2 over `mesh` (default: all ranks, on the device `lm` is on), in place.

    Each decoder layer is its own FSDP unit (its weights are gathered only around its own forward
    and backward); the root is the CompletionLogprobs wrapper, so the embedding, the final norm and
    the (possibly tied) output head are gathered around the whole `completion_logprobs`, whose body
    and chunked head are separate calls on the LM. Train the returned module: `train_step(wrapper, ...)`.

    `param_dtype` (e.g. torch.bfloat16): compute dtype of the all-gathered weights; gradients are
    reduced in float32 and the sharded master weights and optimizer state stay float32. Use it
    instead of StepOptions.autocast_dtype.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mesh is None:  # FSDP's own default is the accelerator's: wrong for a CPU learner on a GPU machine
        mesh = init_device_mesh(next(lm.parameters()).device.type, (dist.get_world_size(),))
    mp = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype is not None
          else MixedPrecisionPolicy())
    for layer in decoder_layers(lm):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    root = CompletionLogprobs(lm)
    fully_shard(root, mesh=mesh, mp_policy=mp)
    return root


def _is_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _aliases(module: torch.nn.Module) -> dict[str, str]:
    """{name: the first name of the same parameter} for tied parameters (Qwen3's lm_head / embed)."""
    first: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if id(p) in first:
            out[name] = first[id(p)]
        else:
            first[id(p)] = name
    return out


def _strip(name: str, module: torch.nn.Module) -> str:
    return name[len(_PREFIX):] if isinstance(module, CompletionLogprobs) and name.startswith(_PREFIX) else name


def _add(name: str, module: torch.nn.Module) -> str:
    return _PREFIX + name if isinstance(module, CompletionLogprobs) else name


# ---- full state: gather for publishing and checkpoints, load for resuming ----------------------

def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights with the unwrapped HF model's names, as CPU tensors on rank 0
    ({} on other ranks); every rank must call it (it all-gathers). Tied parameters share one tensor,
    as in `model.state_dict()`, so node.weights.blob.untie finds them. A module that is not sharded
    gives its own state_dict (no copy)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not _is_sharded(module):
        return {_strip(k, module): v for k, v in module.state_dict().items()}
    sd = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not sd:
        return {}
    for alias, target in _aliases(module).items():  # gathered once per name: share them again
        if alias in sd and target in sd:
            sd[alias] = sd[target]
    return {_strip(k, module): v for k, v in sd.items()}


def optimizer_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state keyed by parameter name (unwrapped HF names), CPU tensors on rank
    0 ({} elsewhere); every rank must call it. The same format for a plain module in one process,
    so a checkpoint resumes on any number of ranks."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(module, optimizer,
                                   options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not osd:
        return {}
    # A snapshot: tensors the optimizer updates in place (AdamW's `step`, which is not sharded;
    # every tensor of an unsharded module) are copied, so later steps do not change what we return.
    live = {_local(t).data_ptr() for st in optimizer.state.values() for t in st.values() if isinstance(t, torch.Tensor)}
    state = {k: {n: v.clone() if isinstance(v, torch.Tensor) and v.data_ptr() in live else v for n, v in st.items()}
             for k, st in osd["state"].items()}
    return _rename_optim({**osd, "state": state}, lambda k: _strip(k, module))


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _rename_optim(osd: dict[str, Any], rename) -> dict[str, Any]:
    return {"state": {rename(k): v for k, v in osd["state"].items()},
            "param_groups": [{**g, "params": [rename(k) for k in g["params"]]} for g in osd["param_groups"]]}


def load_full_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    model_state: dict[str, torch.Tensor] | None,
                    optim_state: dict[str, Any] | None = None) -> None:
    """Load full states (as full_state_dict / optimizer_state give them) that rank 0 holds; every
    rank calls it, ranks > 0 with {} in their place, and receives its shards from rank 0. A module
    that is not sharded loads them directly. A state that is None (on every rank) is not loaded."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    sharded = _is_sharded(module)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=sharded)
    if model_state is not None:
        set_model_state_dict(module, {_add(k, module): v for k, v in model_state.items()}, options=opts)
    if optimizer is not None and optim_state is not None:
        osd: dict[str, Any] = {}
        if optim_state:
            osd = _rename_optim(optim_state, lambda k: _add(k, module))
            # the optimizer may keep tensors as given (unsharded: all of them; sharded: AdamW's scalar
            # `step`) and update them in place: copy them, so that the caller's state stays what it was
            osd["state"] = {k: {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in st.items()}
                            for k, st in osd["state"].items()}
        # gradients left from a step would make torch skip creating a fresh optimizer's state
        optimizer.zero_grad(set_to_none=True)
        set_optimizer_state_dict(module, optimizer, osd, options=opts)


# ---- rank 0 leads, the other ranks follow ------------------------------------------------------

class Leader:
    """Rank 0's handle on the followers: each method broadcasts a command, then does rank 0's part.

    The learner calls these instead of `train_step(model, ...)`, `model.state_dict()`,
    `optimizer.state_dict()` and their loaders; `stop()` when it ends. An exception from `step`
    leaves the ranks out of step with each other: the learner must let it end the job (torchrun
    restarts it from its last checkpoint where --max-restarts allows), not go on training."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, collective: TorchCollective) -> None:
        if collective.rank != 0:
            raise ValueError("Leader runs on rank 0; the other ranks run follow()")
        self.module, self.optimizer, self.dist = module, optimizer, collective
        self.last_command = time.monotonic()

    def _send(self, *command: Any) -> None:
        self.dist.broadcast_object(command)
        self.last_command = time.monotonic()

    def step(self, parts: Sequence[TrainPart], temperature: float, max_grad_norm: float = 1.0,
             options: StepOptions = StepOptions(), lr: float | None = None) -> dict[str, Any]:
        parts = list(parts)
        self._send("step", parts, temperature, max_grad_norm, options, lr)
        return train_step(self.module, self.optimizer, parts, temperature, max_grad_norm, options, dist=self.dist,
                          lr=lr)

    def state_dict(self) -> dict[str, torch.Tensor]:
        self._send("state")
        return full_state_dict(self.module)

    def optimizer_state(self) -> dict[str, Any]:
        self._send("optimizer_state")
        return optimizer_state(self.module, self.optimizer)

    def load(self, model_state: dict[str, torch.Tensor] | None, optim_state: dict[str, Any] | None = None) -> None:
        self._send("load", model_state is not None, optim_state is not None)
        load_full_state(self.module, self.optimizer, model_state, optim_state)

    def keepalive(self, idle_s: float = 3600.0) -> None:
        """Call it from the learner's loop: after `idle_s` without a command it sends one that does
        nothing, so a follower's wait (IDLE_TIMEOUT) never runs out while rank 0 waits for rollouts."""
        if time.monotonic() - self.last_command >= idle_s:
            self._send("ping")

    def stop(self) -> None:
        self._send("stop")


def follow(module: torch.nn.Module, optimizer: torch.optim.Optimizer, collective: TorchCollective) -> int:
    """A rank > 0's whole life: do what rank 0 broadcasts until it says "stop"; returns the number
    of steps taken. An error (a step, a timeout) propagates: torchrun then stops every rank."""
    steps = 0
    while True:
        command = collective.broadcast_object(None)
        op = command[0]
        if op == "step":
            _, parts, temperature, max_grad_norm, options, lr = command
            train_step(module, optimizer, parts, temperature, max_grad_norm, options, dist=collective, lr=lr)
            steps += 1
        elif op == "state":
            full_state_dict(module)
        elif op == "optimizer_state":
            optimizer_state(module, optimizer)
        elif op == "load":
            _, has_model, has_optim = command
            load_full_state(module, optimizer, {} if has_model else None, {} if has_optim else None)
        elif op == "ping":
            continue
        elif op == "stop":
            return steps
        else:
            raise ValueError(f"follower: unknown command {op!r}")
