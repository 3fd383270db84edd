"""Does sharing help? Three learners of three models co-training on one task, with statistics.

    python examples/paper_share/run.py                                   # the runs in docs/RESULTS.md
    python examples/paper_share/run.py --seeds 0 --steps 40              # a quick look
    python examples/paper_share/run.py --analyse-only

Three parties, each a learner of its own built-in arithmetic model (tiny-arith: hidden 128 x 4
layers; tiny-arith-b: 96 x 3; tiny-arith-c: 64 x 5) with one sampler of that model following it
(it loads its learner's new weights every step: on-policy). Every party generates the same
`--own` groups per step in every setting, so the settings differ only in what is shared:

  * alone: each learner trains on its own sampler's groups only;
  * ftis:  each sampler also sends `--share` of its groups per step to each other learner (the
           swarm's fan-out, docs/DESIGN.md "Several learners"), which trains on them beside its
           own, corrected with F-TIS: every step has own + 2 x share groups;
  * text:  the same, the partners' completions trained on as if they were its own (the `pg` loss,
           no correction): how RL Swarm / SAPO share decoded text.

Unlike examples/paper_hetero (a fixed partner), the partners here improve too. The same code as the
simulator (`cli/simulate.py`): real `Learner`s and `Sampler`s on in-memory exchanges and a virtual
clock; deterministic under the seed. A run writes `<out>/<setting>_s<seed>.jsonl` per learner and a
summary; the analysis writes `table.md`, `results.json` and `share.png`.
"""

from __future__ import annotations

from node.learner.config import ForeignConfig

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.paper_delay.run import eval_band, fmt, mean_ci  # noqa: E402

PARTIES = {"arith": "builtin:tiny-arith", "arith-b": "builtin:tiny-arith-b", "arith-c": "builtin:tiny-arith-c"}
SETTINGS = {"alone": "drop", "ftis": "ftis", "text": "pg", "alone-big": "drop"}
"""setting -> the learners' foreign_loss. `alone-big` is a control, not a sharing setting: each
learner's own sampler makes as many groups per step as a sharing learner trains on (own + 2 x
share), at 3x the generation cost: what the same step size is worth with on-policy data."""
DEFAULT_SETTINGS = ("alone", "ftis", "text")


@dataclass
class Party:
    name: str
    learner: object
    exchange: object
    sampler: object
    link: object


def make_parties(setting: str, seed: int, args: argparse.Namespace, out: Path) -> list[Party]:
    import random

    import torch

    from node.engines.hf import HFEngine
    from node.learner import Learner, LearnerConfig
    from node.metrics import MetricsWriter
    from node.models import load_model, load_tokenizer, tokenizer_hash
    from node.sampling.sampler import Sampler
    from node.tasks import ArithmeticConfig, make_task
    from swarm.memory import MemoryExchange

    torch.manual_seed(seed)
    random.seed(seed)
    parties = []
    sharing = setting in ("ftis", "text")
    for name, model in PARTIES.items():
        others = tuple(m for m in PARTIES.values() if m != model)
        foreign = 2 * args.share if sharing else 0
        cfg = LearnerConfig(own_loss="grpo",  # grpo: as RESULTS' runs were made (the default then)
                            foreign_loss=SETTINGS[setting], foreign_options=dict(args.ftis_options),
                            eval_every=args.eval_every, eval_size=args.eval_size, lr=args.lr,
                            groups_per_step=own_groups(setting, args) + foreign,
                            foreign=ForeignConfig(step_share=foreign / (own_groups(setting, args) + foreign), per_sampler=args.share, accept_models=others))  # named: the partners' models are foreign (F-TIS), not audited
        tok = load_tokenizer(model)
        task = make_task(ArithmeticConfig(), tok)
        exchange = MemoryExchange(_Clock.shared, seed=seed)
        learner = Learner(cfg, load_model(model), tok, task, model_id=model, link=exchange,
                          metrics=MetricsWriter(str(out / f"{setting}_s{seed}_{name}.jsonl")),
                          chain=f"sim-{name}-seed-{seed}", keep_records=None)  # each learner its own chain
        engine = HFEngine(load_model(model), tok, model)
        sampler = Sampler(f"sampler-{name}", task, engine, tokenizer_hash(tok), sampling=learner.sampling,
                          swarm=learner.swarm, seed=seed)
        parties.append(Party(name, learner, exchange, sampler, exchange.sampler(f"sampler-{name}")))
    return parties


def own_groups(setting: str, args: argparse.Namespace) -> int:
    """Groups a party's own sampler makes per step."""
    return args.own + 2 * args.share if setting == "alone-big" else args.own


class _Clock:
    """One virtual clock for every party's exchange (set in `run_one`)."""

    shared = None


class FanOut:
    """A sampler's link that also sends the first `share` groups of each batch to each partner
    learner: what a real sampler's outbox does (swarm/rollouts/sender.py), without the network."""

    def __init__(self, link, partners: list, share: int) -> None:
        self.link, self.partners, self.share = link, partners, share

    def send_rollouts(self, records: list[tuple[str, bytes]]) -> None:
        from swarm.delay import DelayConfig

        self.link.send_rollouts(records)
        for exchange in self.partners:
            exchange._deliver(records[: self.share], DelayConfig())

    def fetch_weights(self, have_chain: str, have_version: int):
        return self.link.fetch_weights(have_chain, have_version)


def settings(args: argparse.Namespace) -> dict:
    """What a finished run depends on besides its cell: a resumed grid must not mix settings."""
    return {"steps": args.steps, "own": args.own, "share": args.share, "lr": args.lr, "eval_every": args.eval_every,
            "eval_size": args.eval_size, "ftis_options": dict(args.ftis_options)}


def run_one(job) -> str:
    setting, seed, arg_dict = job
    import torch

    from swarm.memory import VirtualClock

    torch.set_num_threads(1)
    args = argparse.Namespace(**arg_dict)
    out = Path(args.out)
    t = time.time()
    _Clock.shared = clock = VirtualClock()
    parties = make_parties(setting, seed, args, out)
    for p in parties:
        partners = [q.exchange for q in parties if q is not p] if setting in ("ftis", "text") else []
        p.link = FanOut(p.link, partners, args.share)
        p.learner.start()
        p.learner.run_eval()
    tick = 0
    while min(p.learner.version for p in parties) < args.steps and tick < 3 * args.steps:
        clock.advance_to(tick * 30.0)
        for p in parties:
            if p.learner.version < args.steps:
                p.sampler.run_once(p.link, own_groups(setting, args))
        for p in parties:
            if p.learner.version < args.steps:
                p.learner.ingest_many(p.exchange.receive_rollouts(10_000))
                p.learner.step()
        tick += 1
    summary = {"setting": setting, "seed": seed, "settings": settings(args), "learners": {}}
    for p in parties:
        if p.learner.history[-1].get("kind") != "eval":
            p.learner.run_eval()
        p.learner.metrics.close()
        history = p.learner.history
        points = [(r["version"], r["eval_acc"]) for r in history if r["kind"] == "eval"]
        steps = [r for r in history if r["kind"] == "step"]
        ftis = [r["routes"]["foreign"]["filtered_frac"] for r in steps
                if "filtered_frac" in r.get("routes", {}).get("foreign", {})]
        summary["learners"][p.name] = {
            "start": points[0][1], "best": max(a for _, a in points), "last": points[-1][1], "evals": points,
            "foreign_groups": sum(r.get("groups_foreign", 0) for r in steps),
            "filtered_frac": statistics.fmean(ftis) if ftis else None, "steps": len(steps)}
    summary["wall_s"] = round(time.time() - t, 1)
    name = f"{setting}_s{seed}"
    tmp = out / f"{name}.summary.json.tmp"
    tmp.write_text(json.dumps(summary))
    tmp.rename(out / f"{name}.summary.json")  # a killed run leaves no summary, so it is re-run
    return f"{name:10s} " + ", ".join(f"{k} {v['start']:.3f} -> {v['last']:.3f}" for k, v in summary["learners"].items()) \
        + f" ({summary['wall_s']:.0f} s)"


def load(out: Path) -> dict[str, dict[int, dict]]:
    runs: dict[str, dict[int, dict]] = {}
    for p in sorted(out.glob("*.summary.json")):
        s = json.loads(p.read_text())
        runs.setdefault(s["setting"], {})[s["seed"]] = s
    return runs


def last(r: dict) -> float:
    return r["last"]


def over_training(r: dict) -> float:
    """The mean of a learner's evaluations after its start: accuracy over the whole run."""
    return statistics.fmean(a for _, a in r["evals"][1:])


def paired(runs: dict, setting: str, party: str, measure=last) -> list[float]:
    """`measure` of `party` in `setting` minus the same alone, per seed both ran."""
    alone = runs.get("alone", {})
    return [measure(runs[setting][s]["learners"][party]) - measure(alone[s]["learners"][party])
            for s in sorted(runs.get(setting, {})) if s in alone]


def verdicts(runs: dict) -> list[str]:
    """Per sharing setting: does it help every party, on the mean over training (paired, 95%)?"""
    out = []
    for setting in ("ftis", "text"):
        gains = {p: mean_ci(d) for p in PARTIES if (d := paired(runs, setting, p, over_training))}
        if len(gains) == len(PARTIES):
            every = all(m - h > 0 for m, h in gains.values())
            out.append(f"{setting}: {'helps every party' if every else 'does not significantly help every party'} "
                       f"over training ({', '.join(f'{k} {100 * m:+.1f} ± {100 * h:.1f}' for k, (m, h) in gains.items())} points)")
    return out


def analyse(out: Path) -> str:
    runs = load(out)
    lines = ["| learner | setting | seeds | start % | best % | last % | last - alone | over training - alone | "
             "foreign groups / step | F-TIS filtered |", "|---|---|---|---|---|---|---|---|---|---|"]
    for party in PARTIES:
        for setting in SETTINGS:
            cell = runs.get(setting)
            if not cell:
                continue
            rows = [cell[s]["learners"][party] for s in sorted(cell)]
            filt = [r["filtered_frac"] for r in rows if r["filtered_frac"] is not None]
            per_step = statistics.fmean(r["foreign_groups"] / max(1, r["steps"]) for r in rows)
            diffs = [fmt(d) if setting != "alone" and (d := paired(runs, setting, party, m)) else "-"
                     for m in (last, over_training)]
            lines.append(f"| {party} | {setting} | {len(rows)} | {100 * rows[0]['start']:.1f} | "
                         f"{fmt([r['best'] for r in rows])} | {fmt([r['last'] for r in rows])} | {' | '.join(diffs)} | "
                         f"{per_step:.1f} | {f'{100 * statistics.fmean(filt):.1f}%' if filt else '-'} |")
    text = "\n".join(lines) + "\n\n" + "\n".join(verdicts(runs))
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps(runs, indent=1))
    plot(out, runs)
    return text


def plot(out: Path, runs: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PARTIES), figsize=(13, 3.8), sharey=True)
    for ax, party in zip(axes, PARTIES):
        for setting in SETTINGS:
            cell = runs.get(setting, {})
            eval_band(ax, [{"evals": s["learners"][party]["evals"]} for s in cell.values()], setting)
        ax.set_title(f"learner: {PARTIES[party]}")
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy eval accuracy")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "share.png", dpi=110)
    plt.close(fig)


def main() -> None:
    from cli.procs import grid_pool

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--own", type=int, default=8, help="groups each party's sampler makes per step")
    ap.add_argument("--share", type=int, default=8, help="of those, how many go to each partner learner")
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--kl-threshold", type=float, default=None, help="F-TIS gate threshold (default: FTISConfig's)")
    ap.add_argument("--cap", type=float, default=None, help="F-TIS weight cap C (default: FTISConfig's)")

    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/paper_share"))
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    if not 1 <= args.share <= args.own:
        raise SystemExit("--share must be between 1 and --own")
    args.out.mkdir(parents=True, exist_ok=True)
    args.ftis_options = {**({} if args.kl_threshold is None else {"kl_threshold": args.kl_threshold}),
                         **({} if args.cap is None else {"cap": args.cap})}
    if not args.analyse_only:
        done = {p.name: json.loads(p.read_text()) for p in args.out.glob("*.summary.json")}
        for name, s in done.items():
            if s["settings"] != settings(args) and s["setting"] in args.settings:
                raise SystemExit(f"{args.out}/{name} was run with {s['settings']}, not {settings(args)}: use another --out")
        todo = [(st, s) for s in args.seeds for st in args.settings if f"{st}_s{s}.summary.json" not in done]
        arg_dict = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        t0 = time.time()
        with grid_pool(args.workers) as pool:  # no worker outlives this process, however it ends
            for i, line in enumerate(pool.imap_unordered(run_one, [(*j, arg_dict) for j in todo])):
                print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f} s] {line}", flush=True)
    print(analyse(args.out))


if __name__ == "__main__":
    main()
