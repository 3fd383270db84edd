"""Bytes per published version on real RL optimizer steps, beside the entropy bound and today's
baseline.

    python examples/bench_weights.py                       # Qwen3-0.6B shape, GEPO and GRPO, 4 steps each
    python examples/bench_weights.py --shape qwen3-1.7b --steps 2 --algos gepo
    python examples/bench_weights.py --probe-only          # the issue's synthetic probe alone (50M weights)

A Qwen3-shaped model with random weights (examples/model_shapes.py, never downloaded) takes real
optimizer steps: `node.training.step.train_step` with AdamW at `--lr` (1e-6, the papers' scale) on
packed batches of synthetic groups. After every step the learner's `Publisher` publishes a
lossless patch of the bfloat16 view; for each version we print
  * bytes of the patch and their ratio to a full bf16 copy, and the changed fraction of the view;
  * the entropy bound (node/weights/codec.entropy_bound_bytes: which elements changed and by how
    many bf16 steps, per tensor) and how far the patch is from it;
  * encode time (learner) and decode time (a sampler's apply_version, digest check included);
  * the baseline: the int8 blockwise deltas with error feedback the project sent before (lossy,
    one byte per weight plus a float32 scale per 256), made by `int8_ef_bytes` below.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.model_shapes import SHAPES, build, synthetic_groups  # noqa: E402
from node.algorithms import get_algorithm  # noqa: E402
from node.training.step import StepOptions, train_step
from node.training.batch import TrainPart, build_batch  # noqa: E402
from node.weights.codec import Publisher, PublishConfig, apply_version, entropy_bound_bytes  # noqa: E402
from node.weights.blob import untie  # noqa: E402

BF16 = torch.bfloat16


class Int8ErrorFeedback:
    """The baseline: each version sends int8(true - published) blockwise (scale = max|x| / 127 per
    256 values) and the published copy moves by what was sent, so lost precision goes out later."""

    def __init__(self, weights: dict[str, torch.Tensor], block: int = 256) -> None:
        self.published = {k: t.detach().float().clone() for k, t in weights.items()}
        self.block = block

    def send(self, weights: dict[str, torch.Tensor]) -> int:
        nbytes = 0
        for k, t in weights.items():
            x = (t.detach().float() - self.published[k]).reshape(-1)
            blocks = torch.nn.functional.pad(x, (0, (-x.numel()) % self.block)).view(-1, self.block)
            scale = blocks.abs().amax(1, keepdim=True) / 127
            q = torch.round(blocks / torch.where(scale > 0, scale, 1)).clamp(-127, 127)
            self.published[k] += (q * scale).view(-1)[: x.numel()].view(t.shape)
            nbytes += x.numel() + 4 * scale.numel()
        return nbytes


def make_parts(algo_name: str, vocab: int, args, seed: int) -> list[TrainPart]:
    algo = get_algorithm(algo_name)
    cfg = algo.make_config()
    groups = synthetic_groups(vocab, args.groups, args.group_size, args.prompt_len, args.completion_len, seed=seed)
    return [TrainPart("stale", build_batch(groups, cfg.normalize_std, 0), algo, cfg, None)]


def run(algo_name: str, args) -> list[dict]:
    model = build(args.shape).train()
    vocab = model.config.vocab_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    pub = Publisher(PublishConfig(view="bfloat16"), BF16)
    weights = untie(model.state_dict())[0]
    held = apply_version(None, pub.publish(weights, 0))  # what a sampler holds
    baseline = Int8ErrorFeedback(weights)
    full_bf16 = 2 * held.numel()
    print(f"\n{args.shape} ({held.numel() / 1e9:.3f}B weights, a full bf16 copy is {full_bf16 / 1e6:.0f} MB), "
          f"{algo_name}, AdamW lr {args.lr:g}, {args.groups}x{args.group_size} sequences of "
          f"{args.prompt_len}+{args.completion_len} tokens per step")
    print(f"{'v':>3} {'changed':>8} {'patch MB':>9} {'vs bf16':>9} {'bound MB':>9} {'vs bound':>9} "
          f"{'int8-EF':>9} {'encode s':>9} {'decode s':>9} {'step s':>7}")
    rows = []
    for v in range(1, args.steps + 1):
        t0 = time.perf_counter()
        m = train_step(model, optimizer, make_parts(algo_name, vocab, args, seed=v), 1.0, 1.0, StepOptions())
        step_s = time.perf_counter() - t0
        assert m["step_skipped"] == 0, m
        old = pub.published
        weights = untie(model.state_dict())[0]
        enc = pub.publish(weights, v)
        t0 = time.perf_counter()
        held = apply_version(held, enc)
        decode_s = time.perf_counter() - t0
        assert torch.equal(held.view(torch.int16), pub.published.view(torch.int16))
        bound = entropy_bound_bytes(old, pub.published, enc.layout)
        int8 = baseline.send(weights)
        row = dict(v=v, changed=enc.count / held.numel(), bytes=enc.nbytes(), bound=bound, int8=int8,
                   encode_s=enc.stats["weights_encode_s"], decode_s=decode_s, step_s=step_s)
        rows.append(row)
        print(f"{v:>3} {row['changed']:8.2%} {row['bytes'] / 1e6:9.2f} {'1/%.0f' % (full_bf16 / row['bytes']):>9} "
              f"{bound / 1e6:9.2f} {row['bytes'] / bound:8.3f}x {'1/%.1f' % (full_bf16 / int8):>9} "
              f"{row['encode_s']:9.2f} {decode_s:9.2f} {step_s:7.1f}")
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    print(f"mean: patch 1/{full_bf16 / mean('bytes'):.0f} of bf16 ({mean('bytes') / 1e6:.2f} MB), "
          f"{mean('bytes') / mean('bound'):.3f}x the entropy bound (goal <= 1.03x), "
          f"int8-EF 1/{full_bf16 / mean('int8'):.1f}; encode {mean('encode_s'):.2f} s = "
          f"{mean('encode_s') / mean('step_s'):.1%} of this CPU's step, "
          f"{held.numel() / mean('encode_s') / 1e6:.0f} M weights/s; decode {held.numel() / mean('decode_s') / 1e6:.0f} M weights/s")
    return rows


def probe(n: int = 50_000_000) -> None:
    """The issue's synthetic probe: N(0, 0.02) weights, updates of at most 1e-6 per element."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, generator=gen) * 0.02
    pub = Publisher(PublishConfig(view="bfloat16"), BF16)
    pub.publish({"w": w}, 0)
    old = pub.published
    enc = pub.publish({"w": w + 1e-6 * (2 * torch.rand(n, generator=gen) - 1)}, 1)
    bound = entropy_bound_bytes(old, pub.published)
    print(f"\nprobe: {n / 1e6:.0f}M weights ~ N(0, 0.02), updates uniform in [-1e-6, 1e-6]: "
          f"{enc.count / n:.2%} of the bf16 view changed; patch 1/{2 * n / enc.nbytes():.0f} of bf16, "
          f"entropy bound 1/{2 * n / bound:.0f}, patch/bound {enc.nbytes() / bound:.3f}x, "
          f"encode {enc.stats['weights_encode_s']:.2f} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--algos", nargs="+", default=["gepo", "grpo"])
    ap.add_argument("--steps", type=int, default=4, help="optimizer steps (versions) per algorithm")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--probe-only", action="store_true")
    args = ap.parse_args()
    probe()
    if not args.probe_only:
        for name in args.algos:
            run(name, args)
