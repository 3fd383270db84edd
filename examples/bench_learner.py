"""Learner and sampler throughput and memory at LLM shapes, beside the limit of the same hardware.

    python examples/bench_learner.py --shape builtin                  # the demo's model, seconds
    python examples/bench_learner.py --shape qwen3-0.6b --steps 2     # 0.6B on CPU: minutes
    python examples/bench_learner.py --shape qwen3-1.7b --device cuda --dtype bfloat16

For one model shape (the built-in model, or a Qwen3-0.6B/1.7B-shaped model with random weights
built from a config: examples/model_shapes.py), device, dtype and token budget, on the same
packed batch of synthetic groups:
  learner   `node.training.step.train_step` (GEPO, micro-batches under the budget, chunked completion
            log-probs, float32 master weights, autocast in --dtype, AdamW): tokens/s, peak memory
  bare      the same micro-batches through `model(input_ids, labels=...)` + backward, nothing else:
            the hardware's limit for this batch (HF computes logits over every position)
  ratio     learner / bare tokens/s (goal >= 0.9)
  sampler   HF engine generation (tokens/s), and vLLM on the same prompts where it is installed.
On CUDA, MFU = 6 N tokens/s over the GPU's dense bf16 peak (N: parameters); peak memory is
torch's max allocated. On CPU, peak memory is the process's peak resident set during the phase
(Linux /proc/self/clear_refs), above what it held before.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.model_shapes import SHAPES, build, synthetic_groups, tokenizer  # noqa: E402
from node.algorithms import get_algorithm  # noqa: E402
from node.device import resolve  # noqa: E402
from node.training.step import StepOptions, plan_microbatches, train_step
from node.training.batch import TrainPart, build_batch  # noqa: E402

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "RTX 4090": 165.0, "A10": 125.0}
"""Dense bf16 tensor-core peaks from the vendors' data sheets (no sparsity)."""


class PeakMemory:
    """Peak memory of a phase above what was held when it began (bytes)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
            self.base = _status_kb("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.peak = _status_kb("VmHWM") * 1024 - self.base


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def make_parts(vocab: int, groups: int, group_size: int, prompt_len: int, completion_len: int):
    algo = get_algorithm("gepo")
    cfg = algo.make_config()
    batch = build_batch(synthetic_groups(vocab, groups, group_size, prompt_len, completion_len), False, 0)
    return [TrainPart("stale", batch, algo, cfg, None)]


def learner_step(model, parts, options: StepOptions, optimizer) -> None:
    m = train_step(model, optimizer, parts, 1.0, 1.0, options)
    assert m["step_skipped"] == 0, m


def bare_step(model, parts, options: StepOptions, device) -> None:
    """Forward+backward of the same micro-batches with the model's own loss, no optimizer."""
    b = parts[0].batch.packed
    model.train()
    for rows in plan_microbatches(b.attention_mask.sum(-1).tolist(), options.max_tokens_per_microbatch):
        mb = b.rows(rows).to(device)
        with options.autocast(device):
            out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=mb.input_ids, use_cache=False)
        out.loss.backward()
    model.zero_grad(set_to_none=True)
    model.eval()


def timed(fn, device, steps: int) -> tuple[float, int]:
    """(seconds per call, peak bytes) over `steps` calls after one warm-up call."""
    fn()
    with PeakMemory(device) as mem:
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        secs = (time.perf_counter() - t0) / steps
    return secs, mem.peak


def sampler_tokens_per_s(model, vocab: int, device, prompts: int, group: int, new_tokens: int) -> float:
    from node.sampling.params import SamplingParams
    from node.engines.hf import HFEngine

    engine = HFEngine(model, tokenizer(vocab), "bench")
    texts = [f"{3 * i + 11}*{i + 7}=" for i in range(prompts)]
    params = SamplingParams(n=group, temperature=1.0, max_new_tokens=new_tokens)
    engine.generate(texts[:1], SamplingParams(n=1, max_new_tokens=2))  # warm-up
    t0 = time.perf_counter()
    out = engine.generate(texts, params)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return sum(len(c.token_ids) for r in out for c in r.completions) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="builtin", choices=["builtin", *SHAPES])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--budget", type=int, default=4096, help="max_tokens_per_microbatch")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=192)
    ap.add_argument("--steps", type=int, default=3, help="measured steps (after one warm-up)")
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing (learner and bare)")
    ap.add_argument("--sampler-prompts", type=int, default=8)
    ap.add_argument("--sampler-tokens", type=int, default=64)
    args = ap.parse_args()

    place = resolve(args.device, args.dtype)
    if args.shape == "builtin":
        from node.models import BUILTIN_MODEL, load_model

        model = load_model(BUILTIN_MODEL)
        args.prompt_len, args.completion_len = min(args.prompt_len, 8), min(args.completion_len, 6)
    else:
        model = build(args.shape)
    model = model.to(place.device)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    n_params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    parts = make_parts(vocab, args.groups, args.group_size, args.prompt_len, args.completion_len)
    tokens = int(parts[0].batch.packed.attention_mask.sum())
    options = StepOptions(args.budget, place.autocast_dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    print(f"{args.shape}: {n_params / 1e6:.0f}M parameters, vocab {vocab}, on {place}; "
          f"{args.groups} groups x {args.group_size} x ({args.prompt_len} prompt + {args.completion_len} completion) "
          f"= {tokens} tokens per step, budget {args.budget} tokens per micro-batch"
          f"{', activation checkpointing' if args.checkpointing else ''}", flush=True)

    rows = []
    for name, fn in (("learner", lambda: learner_step(model, parts, options, optimizer)),
                     ("bare fwd+bwd", lambda: bare_step(model, parts, options, place.device))):
        secs, peak = timed(fn, place.device, args.steps)
        rows.append((name, tokens / secs, peak))
    print(f"{'':14}{'tokens/s':>10}{'peak memory':>14}{'MFU':>7}")
    gpu = torch.cuda.get_device_name(place.device) if place.device.type == "cuda" else ""
    peak_tflops = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    for name, tps, peak in rows:
        mfu = f"{6 * n_params * tps / (peak_tflops * 1e12):6.1%}" if peak_tflops and place.dtype == torch.bfloat16 else "     -"
        print(f"{name:14}{tps:10.1f}{max(peak, 0) / 2**30:11.2f} GiB {mfu}")
    memory = (f", {rows[0][2] / rows[1][2]:.2f}x peak memory" if rows[1][2] > 2**20
              else " (peak memory below what this measure resolves)")
    print(f"learner / bare: {rows[0][1] / rows[1][1]:.2f}x tokens/s (goal >= 0.9x){memory}")
    if args.sampler_prompts:
        model.to(place.dtype)
        tps = sampler_tokens_per_s(model, vocab, place.device, args.sampler_prompts, args.group_size, args.sampler_tokens)
        print(f"sampler, HF engine ({str(place.dtype).removeprefix('torch.')}): {tps:.1f} tokens/s "
              f"({args.sampler_prompts} prompts x {args.group_size} x up to {args.sampler_tokens} new tokens); "
              f"vLLM on the same prompts: examples/bench_vllm.py --model <folder of examples.model_shapes.save>")


if __name__ == "__main__":
    main()
