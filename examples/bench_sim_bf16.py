"""The simulator's bfloat16 sampler on a CPU: torch's bf16 kernel against float32 products rounded once.

    python examples/bench_sim_bf16.py [--batches 20] [--prompts 8] [--model builtin:tiny-arith]

The stale-rollout grids (examples/paper_delay) emulate a GPU volunteer's sampler with a bfloat16
engine; on a CPU without AVX512-BF16 torch's bf16 matrix product is slow, and the grids' runs spent
most of their time in it. `cli.config.SimSamplerSpec.matmul = "float32"` multiplies each linear
layer in float32 and rounds its output once (`cli.simulate.Float32Linear`), as a GPU's bf16 GEMM
accumulates in float32. Printed, for one `Sampler.produce` batch of the grids' sampling (T 0.6,
top-p 0.95, top-k 20, the task's group size) with one thread:
  - milliseconds a batch with each kernel, median of `--batches`, and their ratio;
  - over every linear layer's output in one prompt's forward: the share of bf16 values on which the
    two kernels disagree, and by how many bf16 steps at most.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from cli.simulate import Float32Linear, float32_matmuls  # noqa: E402
from node.engines.hf import HFEngine  # noqa: E402
from node.models import load_model, load_tokenizer  # noqa: E402
from node.sampling.params import SamplingConfig  # noqa: E402
from node.sampling.sampler import Sampler  # noqa: E402
from node.tasks import ArithmeticConfig, make_task  # noqa: E402


def bf16_model(model_id: str, float32: bool) -> torch.nn.Module:
    net = load_model(model_id).to(torch.bfloat16)
    if float32:
        float32_matmuls(net)
    return net


def ms_per_batch(model_id: str, float32: bool, prompts: int, batches: int) -> float:
    tok = load_tokenizer(model_id)
    engine = HFEngine(bf16_model(model_id, float32), tok, model_id)
    sampler = Sampler("bench", make_task(ArithmeticConfig(), tok), engine, model_id, prompts_per_batch=prompts,
                      sampling=SamplingConfig(temperature=0.6, top_p=0.95, top_k=20))
    sampler.produce()  # warm-up
    times = []
    for _ in range(batches):
        t = time.perf_counter()
        sampler.produce()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def ordered(x: torch.Tensor) -> torch.Tensor:
    """bf16 values as integers in their order, one apart for adjacent values (sign-magnitude bits
    made two's complement; -0 and +0 both 0)."""
    bits = x.view(torch.int16).int()
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def disagreement(model_id: str) -> tuple[int, int, int]:
    """(values compared, values that differ, most bf16 steps apart) over every linear layer's output
    of one forward of a prompt, each layer fed the same bf16 input under both kernels."""
    native = bf16_model(model_id, float32=False)
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}

    def keep(name: str):
        def hook(_module, args, out):
            inputs[name], outputs[name] = args[0].detach(), out.detach()
        return hook

    for name, module in native.named_modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(keep(name))
    tok = load_tokenizer(model_id)
    ids = tok(["12+34=", "7*8=", "99-45="], return_tensors="pt", padding=True).input_ids
    with torch.no_grad():
        native(ids)
        n = differ = worst = 0
        for name, module in native.named_modules():
            if name in inputs:
                a = outputs[name]
                b = Float32Linear(module)(inputs[name])
                steps = (ordered(a) - ordered(b)).abs()
                n, differ, worst = n + a.numel(), differ + int((steps > 0).sum()), max(worst, int(steps.max()))
    return n, differ, worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="builtin:tiny-arith")
    ap.add_argument("--prompts", type=int, default=8, help="prompts a batch (the grids' groups a step)")
    ap.add_argument("--batches", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(1)
    native = ms_per_batch(args.model, False, args.prompts, args.batches)
    fast = ms_per_batch(args.model, True, args.prompts, args.batches)
    n, differ, worst = disagreement(args.model)
    print(f"{args.model}, {args.prompts} prompts a batch, 1 thread, median of {args.batches} batches:")
    print(f"  bf16, torch's kernel         {native:8.1f} ms a batch")
    print(f"  bf16, float32 rounded once   {fast:8.1f} ms a batch   ({native / fast:.2f}x faster)")
    print(f"  linear outputs that differ: {differ} of {n} ({differ / n:.1e}), at most {worst} bf16 step(s) apart")


if __name__ == "__main__":
    main()
