"""node/fit: a model's shape, what each role needs, this machine, verdicts and the README's table (fast).

Parameter counts are checked against transformers' own Qwen3 built on the meta device (no memory);
the memory arithmetic against what it was derived from (the rehearsal's figures, the H100 row); the
verdicts against the table, which the README must hold verbatim."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helpers.repo import ROOT
from node.fit import GIB, QWEN3, Gpu, Machine, ModelShape, Role, Workload, fit_table, model_shape, needs, probe_machine, verdict
from node.fit.needs import ACTIVATION_BYTES, HEAD_WORKSPACE, MEASURED_PEAK, MEASURED_TOKENS, activation_bytes
from node.fit.table import REPORTED_OF_SOLD, table_workload
from node.models import BUILTIN_MODEL, load_model

SHAPES = [ModelShape.from_config(c, name) for name, c in QWEN3.items()]


def test_qwen3_06b_parameters_by_hand():
    s = ModelShape.from_config(QWEN3["Qwen/Qwen3-0.6B"])
    # q 1024x2048, k and v 1024x1024 each, o 2048x1024, q/k norms 128 each, MLP 3 x 1024x3072, 2 norms
    layer = 1024 * 2048 + 2 * 1024 * 1024 + 2048 * 1024 + 2 * 128 + 3 * 1024 * 3072 + 2 * 1024
    assert s.layer_parameters == layer == 15_730_944
    assert s.parameters == 28 * layer + 151_936 * 1024 + 1024 == 596_049_920  # tied head counted once
    assert s.kv_bytes_per_token("bfloat16") == 2 * 28 * 8 * 128 * 2 == 112 * 1024


@pytest.mark.parametrize("name", list(QWEN3))
def test_parameters_equal_a_transformers_qwen3_built_on_the_meta_device(name):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = {k: v for k, v in QWEN3[name].items() if k != "model_type"}
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**config))
    assert ModelShape.from_config(QWEN3[name], name).parameters == sum(p.numel() for p in model.parameters())


def test_the_builtin_models_shape_is_read_from_its_folder_and_counts_its_parameters():
    shape = model_shape(BUILTIN_MODEL)
    assert shape.parameters == sum(p.numel() for p in load_model(BUILTIN_MODEL).parameters())
    assert (shape.layers, shape.hidden, shape.vocab, shape.tied, shape.max_positions) == (4, 128, 99, True, 256)


def test_a_qwen3_hub_id_not_cached_is_known_by_name_and_another_is_refused_with_a_fix():
    assert model_shape("Qwen/Qwen3-8B").parameters == SHAPES[3].parameters
    with pytest.raises(ValueError, match="no config.json") as e:
        model_shape("nobody/no-such-model-xyz")
    assert "hf download nobody/no-such-model-xyz config.json" in e.value.fix


def cpu_rehearsal(role: str) -> Workload:
    """examples/rehearsal.py's run: 4 of Qwen3-0.6B's layers on the CPU, a bfloat16 view, a step of
    4 groups of 4 x (32 + 256) tokens, samplers of 2 prompts x 4."""
    return Workload(device="cpu", dtype="float32", view="bfloat16", microbatch_tokens=16384, checkpointing=False,
                    ranks=1, checkpoints_kept=3, prompts_per_batch=2, group_size=4, prompt_tokens=32, new_tokens=256,
                    step_tokens=4 * 4 * 288)


def test_the_cpu_arithmetic_is_the_rehearsals_times_what_it_measured():
    shape = ModelShape.from_config(dict(QWEN3["Qwen/Qwen3-0.6B"], num_hidden_layers=4), "rehearsal")
    assert shape.parameters == 218_507_264  # "219M parameters"
    # docs/BENCHMARKS.md, "The first swarm at real size": the arithmetic 7.45 (learner), 2.64 (samplers) GiB
    learner = needs(Role.LEARNER, "hf", shape, cpu_rehearsal("learner"))
    sampler = needs(Role.SAMPLER, "hf", shape, cpu_rehearsal("sampler"))
    assert learner.gpu == 0 and learner.host / 1.3 / GIB == pytest.approx(7.45, abs=0.01)
    assert sampler.host / 1.3 / GIB == pytest.approx(2.64, abs=0.02)  # + the logits of a step: 15 MB
    assert 9.38 < learner.host / GIB < 9.38 * 1.1  # measured 9.38 GiB: planned above, not far above


def test_the_activation_figure_reproduces_the_h100_measurement():
    """19.7 GiB above the held state (weights, gradients, AdamW) for a micro-batch of 8,064 tokens."""
    shape = SHAPES[0]
    work = dataclasses.replace(table_workload(), microbatch_tokens=MEASURED_TOKENS)
    assert activation_bytes(shape, work) + HEAD_WORKSPACE == pytest.approx(MEASURED_PEAK, rel=1e-9)
    assert 3.5 < ACTIVATION_BYTES["bfloat16"] < ACTIVATION_BYTES["float32"] == 4
    # 2.5 MB a token for 0.6B (the README's figure); checkpointing keeps far less
    assert activation_bytes(shape, work, 1) == pytest.approx(2.52e6, rel=0.01)
    assert activation_bytes(shape, dataclasses.replace(work, checkpointing=True), 1) < 0.2 * activation_bytes(shape, work, 1)


def test_a_learner_needs_18_bytes_a_parameter_plus_its_activations_and_more_at_adamws_step():
    shape, work = SHAPES[1], table_workload()
    n = needs(Role.LEARNER, "hf", shape, work)
    parts = dict(n.gpu_parts)
    assert parts["float32 weights, gradients, AdamW"] == 16 * shape.parameters
    assert parts["published view"] == 2 * shape.parameters
    assert n.gpu == sum(parts.values())
    tiny = needs(Role.LEARNER, "hf", shape, dataclasses.replace(work, microbatch_tokens=16))
    assert dict(tiny.gpu_parts)["AdamW step's temporary"] == 4 * shape.parameters  # the step's peak then


# ---- the table and the verdicts agree ----------------------------------------------------------

def table_rows() -> dict[str, list[str]]:
    lines = fit_table().splitlines()[2:]
    return {row.split(" | ")[0].strip("| "): [c.strip() for c in row.strip("| ").split(" | ")] for row in lines}


def test_the_readme_holds_the_table_fit_table_prints():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("| Qwen3 | parameters |")
    assert readme[start:].split("\n\n", 1)[0] == fit_table()


def machine(gpu_gb: float | None, ram_gb: float | None, gpus: int = 1) -> Machine:
    """A machine of `gpus` GPUs sold as `gpu_gb` GB, and `ram_gb` GiB of RAM available."""
    cards = () if gpu_gb is None else tuple(Gpu(i, f"{gpu_gb} GB", int(gpu_gb * REPORTED_OF_SOLD * GIB))
                                            for i in range(gpus))
    ram = None if ram_gb is None else int(ram_gb * GIB)
    return Machine(gpus=cards, ram_total=ram, ram_available=ram, disk_free=10**15, cpus=8)


@pytest.mark.parametrize("gpu_gb", [24, 48, 80])
@pytest.mark.parametrize("shape", SHAPES, ids=[s.name for s in SHAPES])
def test_verdicts_on_one_gpu_agree_with_the_table(shape, gpu_gb):
    cell = table_rows()[shape.name.removeprefix("Qwen/Qwen3-")][2 + (24, 48, 80).index(gpu_gb)]
    work, m = table_workload(), machine(gpu_gb, None)
    learner = verdict(Role.LEARNER, "hf", shape, m, work)
    sampler = verdict(Role.SAMPLER, "vllm", shape, dataclasses.replace(m, vllm="0.11"), work)
    assert learner.ok == cell.startswith("learner ·"), (cell, learner)  # fits as it is, no qualifier
    assert sampler.ok == ("sampler (" in cell), (cell, sampler)
    if not learner.ok:  # the fix is the table's way, where it has one
        assert learner.problem.startswith("needs ") and "GPU memory" in learner.problem
        if "(budget" in cell and "FSDP2" not in cell and "checkpointing" not in cell:
            budget = int(cell.split("(budget ")[1].split("k")[0])
            assert f"max_tokens_per_microbatch = {budget * 1024}" in learner.fix, learner.fix
        if "FSDP2 on" in cell:
            assert "--nproc-per-node " + cell.split("FSDP2 on ")[1][0] in learner.fix, learner.fix


@pytest.mark.parametrize("ram_gb", [16, 32, 64])
@pytest.mark.parametrize("shape", SHAPES[:4], ids=[s.name for s in SHAPES[:4]])
def test_verdicts_on_hosts_of_16_32_and_64_gb_agree_with_the_tables_ram_column(shape, ram_gb):
    learner_ram, sampler_ram = table_rows()[shape.name.removeprefix("Qwen/Qwen3-")][5].split(" / ")
    gib = lambda text: float(text.removesuffix(" GiB"))  # noqa: E731
    m = dataclasses.replace(machine(80, ram_gb), vllm="0.11")
    sampler = verdict(Role.SAMPLER, "vllm", shape, m, table_workload())
    assert sampler.ok == (gib(sampler_ram) <= ram_gb), (sampler_ram, sampler)
    if not sampler.ok:
        assert sampler.problem.startswith("needs ") and "of RAM" in sampler.problem
        # freeing RAM is offered only where the machine's RAM in all would hold it
        assert ("free RAM" in sampler.fix) == (sampler.needs.host <= m.ram_total) and sampler.fix
    learner = verdict(Role.LEARNER, "hf", shape, m, table_workload())
    if learner.ok:
        assert gib(learner_ram) <= ram_gb
    elif gib(learner_ram) > ram_gb * 1.05:  # (the column is rounded)
        assert "of RAM" in learner.problem or "GPU memory" in learner.problem


def test_each_fix_offered_fits():
    """A fix is checked before it is offered: applying it makes the verdict ok."""
    shape, work, m = SHAPES[0], table_workload(), machine(24, 64)
    v = verdict(Role.LEARNER, "hf", shape, m, work)
    assert not v.ok and v.fix.startswith("set [learner] max_tokens_per_microbatch = ")
    budget = int(v.fix.split(" = ")[1].split()[0])
    assert verdict(Role.LEARNER, "hf", shape, m, dataclasses.replace(work, microbatch_tokens=budget)).ok
    assert not verdict(Role.LEARNER, "hf", shape, m, dataclasses.replace(work, microbatch_tokens=budget + 1024)).ok


def test_a_learner_too_big_for_any_gpu_here_is_told_to_sample_and_vllm_missing_is_told_how_to_install():
    v = verdict(Role.LEARNER, "hf", SHAPES[3], machine(48, 256), table_workload())
    assert not v.ok and "join as a sampler (--role sampler)" in v.fix, v
    v = verdict(Role.SAMPLER, "vllm", SHAPES[0], machine(24, 64), table_workload())  # vllm: None
    assert not v.ok and v.problem.startswith("vLLM is not installed") and 'pip install "vllm' in v.fix, v
    err = v.error()
    assert str(err).startswith("sampler of Qwen/Qwen3-0.6B on cuda:0 (24 GB): vLLM is not installed") and err.fix == v.fix


def test_a_gpu_others_hold_is_refused_for_its_free_memory():
    m = machine(24, 64)
    busy = dataclasses.replace(m, gpus=(dataclasses.replace(m.gpus[0], free=2 * GIB),))
    v = verdict(Role.SAMPLER, "hf", SHAPES[0], busy, table_workload())
    assert not v.ok and "free: other processes hold" in v.problem and "nvidia-smi" in v.fix


def test_on_the_cpu_the_learner_is_offered_a_smaller_budget_that_fits_its_ram():
    cpu = dataclasses.replace(table_workload(), device="cpu", dtype="float32", step_tokens=10**6)
    v = verdict(Role.LEARNER, "hf", SHAPES[0], machine(None, 32), cpu)
    assert not v.ok and "of RAM" in v.problem and "max_tokens_per_microbatch = " in v.fix, v
    budget = int(v.fix.split("max_tokens_per_microbatch = ")[1].split()[0])
    assert verdict(Role.LEARNER, "hf", SHAPES[0], machine(None, 32), dataclasses.replace(cpu, microbatch_tokens=budget)).ok


def test_fsdp2_needs_as_many_gpus_as_ranks():
    work = dataclasses.replace(table_workload(), ranks=4, checkpointing=True)
    assert not verdict(Role.LEARNER, "hf", SHAPES[2], machine(80, 512, gpus=2), work).ok
    v = verdict(Role.LEARNER, "hf", SHAPES[2], machine(80, 512, gpus=4), work)
    assert v.ok and v.needs.gpus == 4, v


# ---- this machine --------------------------------------------------------------------------------

def test_probing_this_machine_never_fails_and_reads_what_linux_tells(tmp_path):
    m = probe_machine(tmp_path / "not" / "yet")
    assert m.disk_path == str(tmp_path) and m.disk_free > 0
    assert m.cpus >= 1 and m.torch == torch.__version__
    if torch.cuda.is_available():
        assert m.gpus and all(g.total > 0 for g in m.gpus)
    else:
        assert m.gpus == ()
    with open("/proc/meminfo") as f:
        assert "MemTotal" in f.read() and 0 < m.ram_available <= m.ram_total
    json.dumps(dataclasses.asdict(m))  # the doctor's --json


def test_nvidia_smi_answers_are_read_by_uuid(tmp_path, monkeypatch):
    from node.fit import machine as probe

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU-abc-1, 80000, 550.54.14'\necho 'GPU-def-2, 1024, 550.54.14'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert probe._nvidia_smi([]) == ("550.54.14", [("abc-1", 80000 << 20), ("def-2", 1024 << 20)])
    smi.write_text("#!/bin/sh\nexit 9\n")
    notes: list[str] = []
    assert probe._nvidia_smi(notes) is None and notes  # an error is a note, not a failure
