"""The GEPO paper's delay experiment, at tiny scale, in the simulator.

    python examples/paper_delay/run.py                 # default grid, about 15 minutes on 2 cores
    python examples/paper_delay/run.py --steps 100 --seeds 0 1

Grid: GEPO, GRPO and GSPO as the stale-sample loss x {online, max delay 8, max delay 64} learner
steps, weight delays log-normal between 60 s and 1920 s at 0.995 (mu 5.83, sigma 0.62) with
30 virtual seconds per learner step, two samplers, the same seeds and hyper-parameters for every
cell. Then a heterogeneous run: one sampler of the learner's model and one of a different tiny
model (builtin:tiny-arith-b), the foreign rollouts corrected with F-TIS, not corrected (pg), or
dropped. Prints the paper-style table and saves, under --out: one metrics JSONL per run,
results.json, table.md, eval_accuracy.png and is_weight_variance.png.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cli.simulate import SimSamplerSpec, Simulator, SimulatorConfig  # noqa: E402
from node.learner import LearnerConfig  # noqa: E402
from node.models import BUILTIN_MODEL, BUILTIN_MODEL_B  # noqa: E402
from swarm.delay import DelayConfig  # noqa: E402

DELAYS = {"online": None, "max delay 8": 8, "max delay 64": 64}
LOSSES = ("gepo", "grpo", "gspo")
FOREIGN = ("ftis", "pg", "drop")


def run_cell(out: Path, name: str, cfg: SimulatorConfig) -> list[dict]:
    path = out / f"{name}.jsonl"
    path.unlink(missing_ok=True)
    cfg.metrics_path = str(path)
    t = time.time()
    history = Simulator(cfg).run()
    evals = [r["eval_acc"] for r in history if r["kind"] == "eval"]
    print(f"  {name:32s} eval {evals[0]:.3f} -> best {max(evals):.3f}, last {evals[-1]:.3f}  ({time.time() - t:.0f} s)",
          flush=True)
    return history


def delay_cfg(loss: str, max_delay: int | None, steps: int, seed: int, eval_every: int) -> SimulatorConfig:
    weights = DelayConfig() if max_delay is None else DelayConfig(kind="lognormal", lower_s=60, upper_s=1920, confidence=0.995)
    return SimulatorConfig(
        learner=LearnerConfig(stale_loss=loss, eval_every=eval_every, eval_size=300),
        samplers=(SimSamplerSpec(name="sampler", count=2, weight_delay=weights),),
        steps=steps, seconds_per_step=30.0, max_delay_steps=max_delay, seed=seed)


def hetero_cfg(foreign: str, steps: int, seed: int, eval_every: int) -> SimulatorConfig:
    return SimulatorConfig(
        learner=LearnerConfig(stale_loss="gepo", foreign_loss=foreign, eval_every=eval_every, eval_size=300),
        samplers=(SimSamplerSpec(name="own", model=BUILTIN_MODEL), SimSamplerSpec(name="foreign", model=BUILTIN_MODEL_B)),
        steps=steps, seed=seed)


def summarise(history: list[dict]) -> dict[str, float]:
    evals = [r["eval_acc"] for r in history if r["kind"] == "eval"]
    steps = [r for r in history if r["kind"] == "step" and "is_weight_var" in r]
    return {
        "best": max(evals), "last": evals[-1], "gap": max(evals) - evals[-1], "start": evals[0],
        "is_var": statistics.fmean(r["is_weight_var"] for r in steps) if steps else float("nan"),
        "staleness": statistics.fmean(r["staleness_mean"] for r in history if r["kind"] == "step"),
        "kl": statistics.fmean(r["kl_k3"] for r in steps) if steps else float("nan"),
        "clip": statistics.fmean(r["clip_frac"] for r in steps) if steps else float("nan"),
    }


def mean_over_seeds(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}


def delay_table(res: dict) -> str:
    lines = ["| loss | setting | best | last | best-last | vs online (best) | IS-weight var | k3 KL | clip frac | staleness |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for loss in LOSSES:
        online = res[(loss, "online")]["best"]
        for d in DELAYS:
            r = res[(loss, d)]
            lines.append(f"| {loss} | {d} | {r['best']:.3f} | {r['last']:.3f} | {r['gap']:.3f} | "
                         f"{(r['best'] - online) * 100:+.1f} pts | {r['is_var']:.4f} | {r['kl']:.4f} | {r['clip']:.3f} | {r['staleness']:.1f} |")
    return "\n".join(lines)


def hetero_table(res: dict) -> str:
    lines = ["| foreign rollouts | best | last | best-last |", "|---|---|---|---|"]
    for f in FOREIGN:
        r = res[("hetero", f)]
        lines.append(f"| {f} | {r['best']:.3f} | {r['last']:.3f} | {r['gap']:.3f} |")
    return "\n".join(lines)


def plot(out: Path, histories: dict, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for metric, kind, fname, ylabel in (("eval_acc", "eval", "eval_accuracy.png", "eval accuracy (greedy)"),
                                        ("is_weight_var", "step", "is_weight_variance.png", "IS-weight variance")):
        fig, axes = plt.subplots(1, len(LOSSES), figsize=(5 * len(LOSSES), 3.6), sharey=(metric == "eval_acc"))
        for ax, loss in zip(axes, LOSSES):
            for d in DELAYS:
                h = [r for r in histories[(loss, d, seed)] if r["kind"] == kind and metric in r]
                ax.plot([r["version"] for r in h], [r[metric] for r in h], label=d)
            ax.set_title(loss.upper())
            ax.set_xlabel("learner step")
            if metric == "is_weight_var":
                ax.set_yscale("log")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel(ylabel)
        axes[0].legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--out", type=Path, default=Path("runs/paper_delay"))
    ap.add_argument("--skip-hetero", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    histories: dict = {}
    for seed in args.seeds:
        for loss in LOSSES:
            for d, md in DELAYS.items():
                histories[(loss, d, seed)] = run_cell(args.out, f"{loss}_{d.replace(' ', '')}_s{seed}",
                                                      delay_cfg(loss, md, args.steps, seed, args.eval_every))
        if not args.skip_hetero:
            for f in FOREIGN:
                histories[("hetero", f, seed)] = run_cell(args.out, f"hetero_{f}_s{seed}", hetero_cfg(f, args.steps, seed, args.eval_every))
    res = {}
    for (a, b, _), _h in histories.items():
        if (a, b) not in res:
            res[(a, b)] = mean_over_seeds([summarise(histories[(a, b, s)]) for s in args.seeds])
    md_text = (f"steps {args.steps}, seeds {args.seeds}, eval every {args.eval_every} steps on 300 held-out problems; "
               f"means over seeds\n\n{delay_table(res)}\n")
    if not args.skip_hetero:
        md_text += f"\nheterogeneous: one sampler of {BUILTIN_MODEL} (GEPO) + one of {BUILTIN_MODEL_B}\n\n{hetero_table(res)}\n"
    md_text += f"\nwall time {time.time() - t0:.0f} s\n"
    print("\n" + md_text)
    (args.out / "table.md").write_text(md_text)
    (args.out / "results.json").write_text(json.dumps({f"{a}|{b}": v for (a, b), v in res.items()}, indent=1))
    plot(args.out, histories, args.seeds[0])
    print(f"saved {args.out}/table.md, results.json, eval_accuracy.png, is_weight_variance.png")


if __name__ == "__main__":
    main()
