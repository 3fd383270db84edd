"""Where a learner's memory goes at real size, phase by phase, beside the arithmetic.

    python examples/learner_memory.py                      # 4 layers of Qwen3-0.6B, vocabulary 151,936
    python examples/learner_memory.py --layers 2 --versions 2

One process, on the CPU: a `Learner` on a Qwen3 shape with random weights goes through what the
rehearsal's learner does (examples/rehearsal.py): it publishes version 0 (a keyframe), then per
version takes an optimizer step on synthetic groups, publishes a patch, and rebuilds and loads the
versions an audit would ask for (the base model's and the new one's at version 1, then the last
two). After each phase it prints its resident memory and the peak since the phase before (Linux's
VmHWM, reset through /proc/self/clear_refs). The link keeps every version's blob, as the learner's
chunk server does until the next keyframe. No DHT process or p2pd runs here: the rehearsal's
"runtime" (~0.65 GiB) comes on top.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 2 ** 30


def memory() -> tuple[float, float]:
    """(resident, peak since the last reset) in GiB."""
    f = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(f["VmRSS"].split()[0]) / 2 ** 20, int(f["VmHWM"].split()[0]) / 2 ** 20


class Phases:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, name: str) -> None:
        gc.collect()
        rss, peak = memory()
        print(f"{time.perf_counter() - self.t0:7.1f} s  {name:44s} resident {rss:6.2f} GiB   peak in phase {peak:6.2f} GiB",
              flush=True)
        Path("/proc/self/clear_refs").write_text("5")  # the next phase's peak starts from here


class KeepingLink:
    """The learner's side of the exchange, keeping what it is given as the chunk server does."""

    def __init__(self) -> None:
        self.blobs: dict[int, bytes] = {}

    def publish_weights(self, v) -> None:
        if v.base is None:
            self.blobs = {}  # a keyframe starts a new segment
        self.blobs[v.version] = v.blob

    def receive_rollouts(self, max_records: int, timeout: float = 0.0) -> list:
        return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--groups", type=int, default=4, help="groups per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--completion-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not Path("/proc/self/clear_refs").exists():
        raise SystemExit("needs Linux's /proc/self/clear_refs to measure peaks")

    import torch

    import model_shapes
    import rehearsal
    from node.algorithms import get_algorithm
    from node.learner import Learner
    from node.learner.config import LearnerConfig
    from node.tasks import make_task
    from node.tasks.arithmetic import ArithmeticConfig
    from node.training.batch import TrainPart, build_batch
    from node.weights.blob import untie

    torch.set_num_threads(args.threads)
    phase = Phases()
    phase("imports")
    shape = model_shapes.shape_of(args.shape, args.layers)
    model = model_shapes.build(args.shape, layers=args.layers)
    params = sum(p.numel() for p in model.parameters())
    tok = model_shapes.tokenizer(shape["vocab_size"])
    phase(f"model built ({params / 1e6:.0f}M parameters, float32)")
    cfg = LearnerConfig(groups_per_step=args.groups, lr=args.lr, max_tokens_per_microbatch=16384)
    cfg = dataclasses.replace(cfg, weights=dataclasses.replace(cfg.weights, view="bfloat16"))
    learner = Learner(cfg, model, tok, make_task(ArithmeticConfig(), tok), model_id="probe", link=KeepingLink(),
                      keep_records=16, base_weights=lambda: untie(model_shapes.build(args.shape, layers=args.layers).state_dict())[0])
    phase("Learner constructed")
    learner.start()
    phase("version 0 published (a keyframe)")
    groups = model_shapes.synthetic_groups(shape["vocab_size"], args.groups, args.group_size, 32, args.completion_len)
    algo = get_algorithm("grpo")
    acfg = algo.make_config({})
    auditor = learner.auditor
    for v in range(1, args.versions + 1):
        rec: dict = {}
        learner.training.train([TrainPart("own", build_batch(groups, acfg.normalize_std, 0), algo, acfg, None)], rec)
        phase(f"v{v}: optimizer step")
        learner.version = v
        stats = learner.publishing.publish(v)
        phase(f"v{v}: published ({stats['weights_kind']}, {stats['weights_bytes'] / 1e6:.0f} MB)")
        for old in ((0, 1) if v == 1 else (v - 1, v)):  # what a step's audits load
            auditor.model_at(("" if old == 0 else learner.chain, old))
            phase(f"v{v}: v{old} rebuilt and loaded for an audit")
        auditor.release()  # as `Auditor.audit` does after a step's audits
    args_r = argparse.Namespace(view="bfloat16", device="cpu", groups_per_step=args.groups, group_size=args.group_size,
                                completion_len=args.completion_len, prompts_per_batch=2)
    want, rule = rehearsal.predicted_gib("learner", params, shape, args_r)
    print(f"\narithmetic (docs/BENCHMARKS.md, 'What fits'): {want:.2f} GiB = {rule}; "
          f"less the runtime's {rehearsal.RUNTIME_GIB} GiB here: {want - rehearsal.RUNTIME_GIB:.2f} GiB")


if __name__ == "__main__":
    main()
