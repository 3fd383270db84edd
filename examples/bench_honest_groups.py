"""Honest groups failed at the audit's tolerance, pooled over runs: the figure that needs the most
groups (issue 40: a Wilson 95% upper end below 0.1% needs 3,838 groups with none failed).

    python examples/bench_honest_groups.py run --device cuda --shape big --dtype bfloat16 \
        --seconds 240 --out docs/results/honest_groups/h100-big-bf16.jsonl
    python examples/bench_honest_groups.py summary docs/results/honest_groups/*.jsonl

On the 151k shape an H100 samples ~2,000-4,000 tokens/s with the HF engine at batch 128 (docs/
BENCHMARKS.md), so 3,838 groups of 8 x 128 tokens are 16-33 minutes of GPU: more than one lent
session holds (15 minutes, starts included). `run` therefore samples until a deadline and appends
one line per audited group (its largest margin, its flips, its positions) to a JSON-lines file,
with everything that makes groups comparable: the shape and a fingerprint of its random weights,
the sampler's dtype, batch and length, the sampling setting, the device, torch's version. Each run
draws its own prompts and seeds, so `summary` pools every file's groups of one setting into one
count: honest groups failed at `--margin` with a Wilson 95% interval, the largest margin seen, and
the flips. Kernels differ between GPUs, so the device is part of the setting.

Sampling is the HF engine's own picker (node/engines/hf.PickTokens) in the sampler's dtype; the
audit is the float32 copy of the same model on the same device (node/sampling/race.race_margins, as
the learner's audit computes it), like examples/bench_bf16_audit.py, with the pieces both share
(examples/audit_parts.py).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from examples.audit_parts import DTYPES, generate, measure, random_model  # noqa: E402
from node.audit.margins import FLIP_MARGIN, AuditItem
from node.audit.flips import wilson  # noqa: E402
from node.sampling.race import group_seeds  # noqa: E402
from node.sampling.params import SamplingParams  # noqa: E402
from node.learner.config import AuditConfig  # noqa: E402

SETTING_KEYS = ("shape", "layers", "weights", "dtype", "batch", "tokens", "temperature", "top_k", "top_p", "device")
"""What makes two groups the same measurement; everything else in a record is per group or per run."""


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of the output head: random weights built on another device or torch version
    (their init, the head's scaling) are another model, whose groups do not pool."""
    w = model.lm_head.weight.detach().float().cpu()
    return hashlib.sha256(w[:64].numpy().tobytes() + repr(float(w.double().sum())).encode()).hexdigest()[:12]


def run(args) -> None:
    device = torch.device(args.device)
    model32 = random_model(args.shape, args.layers, device)
    sampler = model32 if args.dtype == "float32" else copy.deepcopy(model32).to(DTYPES[args.dtype])
    vocab = model32.config.vocab_size
    params = SamplingParams(n=8, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            max_new_tokens=args.tokens)
    setting = dict(shape=args.shape, layers=model32.config.num_hidden_layers, weights=fingerprint(model32),
                   dtype=args.dtype, batch=args.batch, tokens=args.tokens, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p,
                   device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU")
    run_id = os.urandom(6).hex()  # its own prompts and seeds: runs pool without repeating a group
    g = torch.Generator().manual_seed(int(run_id, 16))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    deadline, rounds, groups, sampled_s, last = time.monotonic() + args.seconds, 0, 0, 0.0, 0.0
    with args.out.open("a") as f:
        # a round is one generate call of `batch` rows (batch / 8 groups); none starts that would
        # end past the deadline, judged by the last round's length
        while time.monotonic() + last < deadline and (not args.groups or groups < args.groups):
            t0 = time.monotonic()
            prompts = torch.randint(1, vocab, (max(1, args.batch // 8), args.prompt_len), generator=g).tolist()
            seeds = [group_seeds(bytes(16), f"{run_id}:{rounds}:{i}", "sampler", 8) for i in range(len(prompts))]
            done, elapsed = generate(sampler, prompts, params, seeds, args.batch, None, 0)
            items = [AuditItem(p, d, s) for p, d, s in zip(prompts, done, seeds)]
            for margins in measure(model32, items, params, 0, per_pass=args.per_pass).margins:
                f.write(json.dumps(dict(setting, run=run_id, torch=torch.__version__, positions=len(margins),
                                        max_margin=float(margins.max()), flips=int((margins > FLIP_MARGIN).sum()))) + "\n")
            f.flush()
            rounds, groups, sampled_s, last = rounds + 1, groups + len(items), sampled_s + elapsed, time.monotonic() - t0
            print(f"round {rounds}: {groups} groups, sampled at {groups * 8 * args.tokens / sampled_s:.0f} tokens/s, "
                  f"{last:.1f} s a round", flush=True)
    print(f"{groups} groups appended to {args.out} (run {run_id})")


def pooled(records: list[dict], margin: float) -> list[dict]:
    """One row per setting: its groups over every run, those whose largest margin exceeds `margin`
    with the Wilson 95% interval, the largest margin, flips per position."""
    rows: dict[tuple, dict] = {}
    for r in records:
        key = tuple(r[k] for k in SETTING_KEYS)
        row = rows.setdefault(key, dict(zip(SETTING_KEYS, key), runs=set(), groups=0, positions=0, flips=0,
                                        failed=0, max_margin=0.0))
        row["runs"].add(r["run"])
        row["groups"] += 1
        row["positions"] += r["positions"]
        row["flips"] += r["flips"]
        row["failed"] += int(r["max_margin"] > margin)
        row["max_margin"] = max(row["max_margin"], r["max_margin"])
    for row in rows.values():
        row["runs"] = len(row["runs"])
        row["failed_lo"], row["failed_hi"] = wilson(row["failed"], row["groups"])
    return sorted(rows.values(), key=lambda r: tuple(str(r[k]) for k in SETTING_KEYS))


def summary(args) -> None:
    records = [json.loads(line) for path in args.files for line in path.read_text().splitlines() if line.strip()]
    print(f"| shape | sampler | device | runs | groups | tokens | flips | max margin | "
          f"honest groups failed at {args.margin:g} (95% upper) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in pooled(records, args.margin):
        sampling = f"T={r['temperature']:g}" + (f", top-k {r['top_k']}" if r["top_k"] else "") + \
            (f", top-p {r['top_p']:g}" if r["top_p"] < 1 else "")
        print(f"| {r['shape']} ({r['layers']} layers, weights {r['weights']}), {r['tokens']} tokens, {sampling} | "
              f"HF {r['dtype']} batch {r['batch']} | {r['device']} | {r['runs']} | {r['groups']} | {r['positions']} | "
              f"{r['flips'] / max(r['positions'], 1):.3%} | {r['max_margin']:.3g} | "
              f"{r['failed']} ({r['failed_hi']:.3%}) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="sample and audit honest groups until a deadline; append them to --out")
    r.add_argument("--device", default="cpu")
    r.add_argument("--shape", choices=["mid", "big"], default="big",
                   help="mid: 8 layers, vocabulary 32,768; big: the Qwen3-0.6B shape, vocabulary 151,936")
    r.add_argument("--layers", type=int, default=28, help="layers of the big shape (28 is Qwen3-0.6B's)")
    r.add_argument("--dtype", choices=list(DTYPES), default="bfloat16", help="the sampler's precision")
    r.add_argument("--batch", type=int, default=128, help="rows per generate call (8 per group)")
    r.add_argument("--tokens", type=int, default=128, help="completion tokens")
    r.add_argument("--prompt-len", type=int, default=32)
    r.add_argument("--temperature", type=float, default=1.0)
    r.add_argument("--top-k", type=int, default=0)
    r.add_argument("--top-p", type=float, default=1.0)
    r.add_argument("--seconds", type=float, default=240, help="start no round that would end past this")
    r.add_argument("--groups", type=int, default=0, help="stop after this many groups (0: the deadline only)")
    r.add_argument("--per-pass", type=int, default=16, help="groups per audit forward pass")
    r.add_argument("--out", type=Path, required=True, help="JSON-lines file the groups are appended to")
    s = sub.add_parser("summary", help="pool every file's groups per setting into one table (markdown)")
    s.add_argument("files", type=Path, nargs="+")
    s.add_argument("--margin", type=float, default=AuditConfig.margin, help="the audit's tolerance (logits)")
    args = ap.parse_args()
    run(args) if args.command == "run" else summary(args)


if __name__ == "__main__":
    main()
