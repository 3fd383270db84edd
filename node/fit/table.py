"""The README's "what fits" table, computed: Qwen3 sizes x GPUs of 24, 48 and 80 GB, and RAM.

    print(fit_table())          # hetero-node doctor --table; tests/unit/node/test_fit.py checks the README has it
"""

from __future__ import annotations

import dataclasses

from node.fit.machine import Gpu, Machine
from node.fit.needs import GIB, VLLM_MAX_UTILIZATION, Role, Workload, needs
from node.fit.shape import ModelShape, qwen3_shapes
from node.fit.verdict import FSDP_RANKS, fits, learner_option

GPU_SIZES = (24, 48, 80)
"""The cards' sizes in GB, as sold (RTX 3090/4090; A6000, L40S; A100, H100)."""
REPORTED_OF_SOLD = 0.985
"""What torch reports of a card's memory, in GiB, over the size it is sold as: an 80 GB H100 reports
about 79.2 GiB, a 24 GB RTX 4090 about 23.6."""


def table_workload() -> Workload:
    """What the table assumes: a GPU node in bfloat16 at the learner's default token budget, and a
    real model's sampler: 8 prompts x 8 completions of up to 512 prompt + 1,024 new tokens."""
    from node.learner.config import LearnerConfig

    learner = LearnerConfig()
    return Workload(device="cuda", dtype="bfloat16", view="bfloat16",
                    microbatch_tokens=learner.max_tokens_per_microbatch, checkpointing=False, ranks=1, checkpoints_kept=learner.checkpoint.keep, prompts_per_batch=8,
                    group_size=8, prompt_tokens=512, new_tokens=1024)


def fit_table(work: Workload | None = None) -> str:
    """The markdown table: one row per Qwen3 size, what runs on one GPU of each size, RAM beside it."""
    work = work or table_workload()
    head = ["Qwen3", "parameters", *(f"{g} GB GPU" for g in GPU_SIZES), "RAM beside the GPU: learner / sampler"]
    rows = [head, ["---"] * len(head)]
    for shape in qwen3_shapes():
        rows.append([shape.name.removeprefix("Qwen/Qwen3-"), f"{shape.parameters / 1e9:.2f}B",
                     *(_cell(shape, work, size) for size in GPU_SIZES),
                     " / ".join(_gib(needs(role, engine, shape, work).host)
                                for role, engine in ((Role.LEARNER, "hf"), (Role.SAMPLER, "vllm")))])
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _cell(shape: ModelShape, work: Workload, size: int) -> str:
    """What runs on one GPU of `size` GB (a learner also on up to 8 of them, with FSDP2)."""
    gpu = Gpu(0, f"{size} GB", int(size * REPORTED_OF_SOLD * GIB))
    machine = Machine(gpus=tuple(dataclasses.replace(gpu, index=i) for i in range(max(FSDP_RANKS))))
    said = []
    option = learner_option(shape, work, gpu.total, max(FSDP_RANKS))
    if option is not None:
        how = [f"budget {option.budget // 1024}k"] if option.budget != work.microbatch_tokens else []
        how += (["checkpointing"] if option.checkpointing else []) + (
            [f"FSDP2 on {option.ranks}"] if option.ranks > 1 else [])
        said.append("learner" + (f" ({', '.join(how)})" if how else ""))
    if fits(Role.SAMPLER, "vllm", shape, machine, work, gpu):
        said.append(f"sampler ({_kv_tokens(shape, work, gpu) // 1000:,}k KV tokens)")
    return " · ".join(said) or "-"


def _kv_tokens(shape: ModelShape, work: Workload, gpu: Gpu) -> int:
    """The KV cache's tokens vLLM has beside the weights, at its largest share of the GPU."""
    bare = needs(Role.SAMPLER, "vllm", shape, dataclasses.replace(work, prompts_per_batch=0), gpu.total).gpu
    return max(0, int((VLLM_MAX_UTILIZATION * gpu.total - bare) // shape.kv_bytes_per_token(work.dtype)))


def _gib(n: int) -> str:
    return f"{n / GIB:,.0f} GiB" if n >= 10 * GIB else f"{n / GIB:.1f} GiB"
