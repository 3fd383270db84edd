"""Heterogeneous partners: a weaker and a stronger model sharing rollouts, with statistics.

    python examples/paper_hetero/run.py                       # the runs in docs/RESULTS.md
    python examples/paper_hetero/run.py --seeds 0 --steps 60  # a quick look
    python examples/paper_hetero/run.py --analyse-only

Two models of the arithmetic task that differ in shape and skill are made first by
examples/make_tiny_model.py (saved under `<out>/models`, reused when present): `weak` (hidden 96,
3 layers, stopped at >= 15% greedy) and `strong` (hidden 128, 4 layers, >= 55%). Then, for each
model as the learner and each seed, the simulator runs
  * alone:  two samplers of the learner's model;
  * ftis:   one sampler of the learner's model + one of the partner's, corrected with F-TIS;
  * text:   the same, the partner's completions trained on as if they were the learner's own
            (the `pg` loss, no correction): how RL Swarm / SAPO share decoded text;
with the same number of groups per step in all three. The partner's sampler keeps its own
weights (the simulator has one learner), so this is sharing with a fixed partner, not two
learners training each other.

Before the runs, `gate` measures F-TIS's filter statistic (the mean over tokens of
k3 = exp(l^g - l^p) - (l^g - l^p) - 1) on completions the learner scores from several generators:
the learner itself, the partner, a model trained on another task (tiny-chain) and a random-init
model of the learner's shape; it writes the quantiles of the failed completions (the only ones
the filter can drop) and how often each threshold fires (`gate.md`). Results: `table.md`,
`results.json`, `partners.png`, one metrics JSONL per run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.paper_delay.run import eval_band, fmt  # noqa: E402

MODELS = {  # name -> make_tiny_model arguments (deterministic under the seed)
    "weak": ["--hidden", "96", "--layers", "3", "--heads", "4", "--seed", "2", "--lr", "5e-4",
             "--eval-every", "20", "--target-acc", "0.15"],
    "strong": ["--hidden", "128", "--layers", "4", "--heads", "4", "--seed", "3", "--lr", "1e-3",
               "--eval-every", "20", "--target-acc", "0.55"],
}
SETTINGS = ("alone", "ftis", "text")
THRESHOLDS = (1.0, 5.0, 20.0, 50.0, 200.0, 1000.0)


def ensure_models(out: Path) -> dict[str, str]:
    paths = {}
    for name, extra in MODELS.items():
        path = out / "models" / name
        if not (path / "config.json").exists():
            print(f"making the {name} model under {path} ...", flush=True)
            subprocess.run([sys.executable, str(ROOT / "examples/make_tiny_model.py"), "--name", f"arith-{name}",
                            "--out", str(path), *extra], check=True, stdout=subprocess.DEVNULL)
        paths[name] = str(path)
    return paths


# ---- F-TIS gate statistics ---------------------------------------------------------------------

def gate_values(learner: str, generator: str, n_prompts: int, seed: int) -> tuple[list[float], list[float]]:
    """(gate of each failed completion, of each correct one): `generator` samples G = 8
    completions of `n_prompts` training prompts at T = 1, the learner scores them."""
    import torch

    from node.algorithms.base import k3, seq_mean
    from node.sampling.params import SamplingParams
    from node.engines.hf import HFEngine
    from node.training.logprobs import completion_logprobs, completion_span, pack
    from node.models import load_model, load_tokenizer, resolve_model_path
    from node.tasks import ArithmeticConfig, ArithmeticTask

    torch.manual_seed(seed)
    tok = load_tokenizer(learner)
    task = ArithmeticTask(ArithmeticConfig())
    problems = random.Random(seed).sample(list(task.split("train")), n_prompts)  # not the first ones: all "0+b="
    if generator == "random-init":  # an untrained model of the learner's shape: text far from anything p writes
        from transformers import AutoConfig, AutoModelForCausalLM

        gen_model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_path(learner))).eval()
    else:
        gen_model = load_model(generator)
    results = HFEngine(gen_model, tok, generator).generate([p.prompt for p in problems],
                                                           SamplingParams(n=8, temperature=1.0, max_new_tokens=6))
    prompts, comps, lg, rewards = [], [], [], []
    for prob, res in zip(problems, results):
        for c in res.completions:
            if not c.token_ids:
                continue
            prompts.append(res.prompt_token_ids)
            comps.append(c.token_ids)
            lg.append(c.logprobs)
            rewards.append(task.reward(c.text, prob.answer))
    batch = pack(prompts, comps, tok.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(load_model(learner), batch, temperature=1.0)
    old = torch.zeros_like(lp)
    for i, (p, g) in enumerate(zip(prompts, lg)):
        old[i, completion_span(len(p), len(g))] = torch.tensor(g)
    gate = seq_mean(k3(old - lp), batch.completion_mask).tolist()  # mean_t k3(l^g - l^p), as ftis_weights
    return [v for v, r in zip(gate, rewards) if r <= 0], [v for v, r in zip(gate, rewards) if r > 0]


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def gate_report(models: dict[str, str], n_prompts: int) -> str:
    lines = ["| learner | generator | failed completions | p50 | p90 | p99 | max | "
             + " | ".join(f"> {t:g}" for t in THRESHOLDS) + " |", "|---|---|---|---|---|---|---|" + "---|" * len(THRESHOLDS)]
    for learner, partner in (("weak", "strong"), ("strong", "weak")):
        for gen_name, gen in (("itself", models[learner]), ("partner", models[partner]),
                              ("tiny-chain (other task)", "builtin:tiny-chain"), ("random init", "random-init")):
            bad, _ = gate_values(models[learner], gen, n_prompts, seed=0)
            fires = " | ".join(f"{100 * sum(v > t for v in bad) / max(1, len(bad)):.0f}%" for t in THRESHOLDS)
            lines.append(f"| {learner} | {gen_name} | {len(bad)} | {quantile(bad, .5):.3g} | {quantile(bad, .9):.3g} | "
                         f"{quantile(bad, .99):.3g} | {max(bad, default=float('nan')):.3g} | {fires} |")
    return "\n".join(lines)


# ---- the partner runs ----------------------------------------------------------------------------

def build_config(learner: str, partner: str, setting: str, seed: int, args: argparse.Namespace, metrics_path: str):
    from cli.config import SimSamplerSpec, SimulatorConfig
    from node.learner import LearnerConfig
    from node.learner.config import ForeignConfig
    from node.tasks import ArithmeticConfig

    foreign = {"alone": "drop", "ftis": "ftis", "text": "pg"}[setting]
    samplers = ((SimSamplerSpec(name="own", count=2),) if setting == "alone" else
                (SimSamplerSpec(name="own"), SimSamplerSpec(name="partner", model=partner)))
    return SimulatorConfig(
        model=learner, task=ArithmeticConfig(),
        learner=LearnerConfig(own_loss="gepo", foreign_loss=foreign, foreign_options=dict(args.ftis_options),
                              eval_every=args.eval_every, eval_size=args.eval_size,
                              # the partner shares our tokenizer: named, it is taken as foreign, at its own share
                              foreign=ForeignConfig(accept_models=(partner,), step_share=1.0, per_sampler=1 << 20)),
        samplers=samplers, steps=args.steps, seed=seed, threads=1, metrics_path=metrics_path)


def settings(args: argparse.Namespace) -> dict:
    """What a finished run depends on besides its cell: a resumed grid must not mix settings."""
    return {"steps": args.steps, "eval_every": args.eval_every, "eval_size": args.eval_size,
            "ftis_options": dict(args.ftis_options)}


def run_one(job) -> str:
    learner_name, setting, seed, models, arg_dict = job
    from cli.simulate import Simulator

    args = argparse.Namespace(**arg_dict)
    out = Path(args.out)
    name = f"{learner_name}_{setting}_s{seed}"
    partner = models["strong" if learner_name == "weak" else "weak"]
    t = time.time()
    history = Simulator(build_config(models[learner_name], partner, setting, seed, args, str(out / f"{name}.jsonl"))).run()
    points = [(r["version"], r["eval_acc"]) for r in history if r["kind"] == "eval"]
    evals = [acc for _, acc in points]
    steps = [r for r in history if r["kind"] == "step"]
    ftis = [r["routes"]["foreign"]["filtered_frac"] for r in steps if "filtered_frac" in r.get("routes", {}).get("foreign", {})]
    summary = {"learner": learner_name, "setting": setting, "seed": seed, "start": evals[0], "best": max(evals),
               "last": evals[-1], "gap": max(evals) - evals[-1], "evals": points,
               "filtered_frac": statistics.fmean(ftis) if ftis else None,
               "settings": settings(args), "wall_s": round(time.time() - t, 1)}
    tmp = out / f"{name}.summary.json.tmp"
    tmp.write_text(json.dumps(summary))
    tmp.rename(out / f"{name}.summary.json")  # a killed run leaves no summary, so it is re-run
    return f"{name:22s} eval {summary['start']:.3f} -> best {summary['best']:.3f}, last {summary['last']:.3f} ({summary['wall_s']:.0f} s)"


def analyse(out: Path) -> str:
    cells: dict[tuple[str, str], dict[int, dict]] = {}
    for p in sorted(out.glob("*.summary.json")):
        s = json.loads(p.read_text())
        cells.setdefault((s["learner"], s["setting"]), {})[s["seed"]] = s
    lines = ["| learner | setting | seeds | start % | best % | last % | last - alone (paired) | F-TIS filtered |",
             "|---|---|---|---|---|---|---|---|"]
    for learner in ("weak", "strong"):
        alone = cells.get((learner, "alone"), {})
        for setting in SETTINGS:
            runs = cells.get((learner, setting))
            if not runs:
                continue
            seeds = sorted(runs)
            paired = [runs[s]["last"] - alone[s]["last"] for s in seeds if s in alone]
            filt = [runs[s]["filtered_frac"] for s in seeds if runs[s]["filtered_frac"] is not None]
            lines.append(f"| {learner} | {setting} | {len(seeds)} | {100 * runs[seeds[0]]['start']:.1f} | "
                         f"{fmt([runs[s]['best'] for s in seeds])} | {fmt([runs[s]['last'] for s in seeds])} | "
                         f"{fmt(paired) if setting != 'alone' and paired else '-'} | "
                         f"{f'{100 * statistics.fmean(filt):.1f}%' if filt else '-'} |")
    text = "\n".join(lines)
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({f"{k[0]}|{k[1]}": v for k, v in cells.items()}, indent=1))
    plot(out, cells)
    return text


def plot(out: Path, cells: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, learner in zip(axes, ("weak", "strong")):
        for setting in SETTINGS:
            eval_band(ax, list(cells.get((learner, setting), {}).values()), setting)
        ax.set_title(f"learner: {learner} model")
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy eval accuracy")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "partners.png", dpi=110)
    plt.close(fig)


def main() -> None:
    from cli.procs import grid_pool

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--kl-threshold", type=float, default=None, help="F-TIS gate threshold (default: FTISConfig's)")
    ap.add_argument("--gate-prompts", type=int, default=64, help="prompts per generator for the gate statistics")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS, help="which of the runs to do")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/paper_hetero"))
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.ftis_options = {} if args.kl_threshold is None else {"kl_threshold": args.kl_threshold}
    if not args.analyse_only:
        models = ensure_models(args.out)
        if not (args.out / "gate.md").exists():
            (args.out / "gate.md").write_text(gate_report(models, args.gate_prompts) + "\n")
        print((args.out / "gate.md").read_text(), flush=True)
        done = {p.name: json.loads(p.read_text()) for p in args.out.glob("*.summary.json")}
        for name, s in done.items():
            if s.get("settings", settings(args)) != settings(args) and s["setting"] in args.settings:
                raise SystemExit(f"{args.out}/{name} was run with {s['settings']}, not {settings(args)}: use another --out")
        todo = [(lrn, st, s) for s in args.seeds for lrn in ("weak", "strong") for st in args.settings
                if f"{lrn}_{st}_s{s}.summary.json" not in done]
        arg_dict = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        t0 = time.time()
        with grid_pool(args.workers) as pool:  # no worker outlives this process, however it ends
            for i, line in enumerate(pool.imap_unordered(run_one, [(*j, models, arg_dict) for j in todo])):
                print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f} s] {line}", flush=True)
    print(analyse(args.out))


if __name__ == "__main__":
    main()
