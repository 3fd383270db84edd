"""The sharing experiment on a real loopback swarm: three learners, three samplers, real processes.

    python examples/paper_share/real.py                          # alone, ftis, text x 5 seeds
    python examples/paper_share/real.py --seeds 0 --settings ftis --steps 40
    python examples/paper_share/real.py --analyse-only

The same three parties as examples/paper_share/run.py (the simulator), now as `hetero-node`
processes on 127.0.0.1: a bootstrap naming the three learners with their models, each learner
`join --role learner` with its model, each sampler `join --role sampler` of that model. A sampler
follows its own model's learner and sends a copy of each group to the learners that take its model
(`accept_models`): none in `alone` (foreign_loss = drop: they invite nobody), both others in `ftis`
and `text`. Unlike the simulator nothing is in lock-step: a learner steps when its groups are in,
samplers generate at their own pace, so the share of foreign groups per step is whatever arrives
(at most `foreign_step_share`). Runs one swarm at a time (the 2-core budget); each writes
`<out>/<setting>_s<seed>/` (logs and metrics) and a summary; the analysis prints the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.paper_share.run import (DEFAULT_SETTINGS, PARTIES, SETTINGS, last, load, over_training, paired,  # noqa: E402
                                      verdicts)
from examples.paper_delay.run import fmt  # noqa: E402


def learner_toml(model: str, setting: str, args: argparse.Namespace) -> str:
    others = ", ".join(f'"{m}"' for m in PARTIES.values() if m != model)
    foreign = 0 if setting == "alone" else 2 * args.share
    return (f"seed = {args.seed_now}\n[learner]\nown_loss = \"grpo\"\neval_every = {args.eval_every}\neval_size = {args.eval_size}\n"
            f"groups_per_step = {args.own + foreign}\nforeign_loss = \"{SETTINGS[setting]}\"\n"
            f"foreign = {{ step_share = {foreign / (args.own + foreign)}, per_sampler = {args.share}, "
            f"accept_models = [{others}] }}\n")


def run_swarm(setting: str, seed: int, args: argparse.Namespace) -> dict:
    from cli.procs import start_node, stop, wait_for_file
    from swarm.identity import Identity

    base = args.out / f"{setting}_s{seed}"
    logs = base / "logs"
    ids = {k: Identity.load_or_create(base / f"learner-{k}" / "identity.key").peer_id for k in PARTIES}
    procs = []
    try:
        named = [a for k, m in PARTIES.items() for a in ("--trusted-learner", f"{ids[k]}={m}")]
        procs.append(start_node("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                              "--identity", str(base / "boot.key"), "--addr-file",
                                              str(base / "boot.addr"), *named], logs))
        addr = wait_for_file(base / "boot.addr", 90, procs[0]).decode().split()[0]
        args.seed_now = seed
        for k, model in PARTIES.items():
            (base / f"learner-{k}.toml").write_text(learner_toml(model, setting, args))
            procs.append(start_node(f"learner-{k}", ["join", "--role", "learner", "--model", model, "--initial-peers", addr,
                                                     "--no-nat", "--workdir", str(base / f"learner-{k}"), "--config",
                                                     str(base / f"learner-{k}.toml"), "--max-steps", str(args.steps)], logs))
        time.sleep(args.settle_s)  # the learners announce (and say what they take) before samplers look
        for k, model in PARTIES.items():
            (base / f"sampler-{k}.toml").write_text(f"seed = {seed}\n")
            procs.append(start_node(f"sampler-{k}", ["join", "--role", "sampler", "--model", model, "--initial-peers",
                                                     addr, "--no-nat", "--workdir", str(base / f"sampler-{k}"),
                                                     "--config", str(base / f"sampler-{k}.toml")], logs))
        deadline = time.monotonic() + args.timeout_s
        while time.monotonic() < deadline and not all(_finished(base, k, args.steps) for k in PARTIES):
            time.sleep(2)
    finally:
        stop(procs)
    out = {"setting": setting, "seed": seed, "learners": {}}
    for k in PARTIES:
        rows = _metrics(base, k)
        evals = [(r["version"], r["eval_acc"]) for r in rows if r["kind"] == "eval"]
        steps = [r for r in rows if r["kind"] == "step"]
        out["learners"][k] = {"start": evals[0][1], "best": max(a for _, a in evals), "last": evals[-1][1],
                              "evals": evals, "steps": len(steps),
                              "foreign_groups": sum(r.get("groups_foreign", 0) for r in steps)}
    return out


def _metrics(base: Path, k: str) -> list[dict]:
    path = base / f"learner-{k}" / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _finished(base: Path, k: str, steps: int) -> bool:
    rows = _metrics(base, k)
    return any(r["kind"] == "eval" and r["version"] >= steps for r in rows)


def analyse(out: Path) -> str:
    runs = load(out)
    lines = ["| learner | setting | seeds | last % | last - alone | over training - alone | foreign groups / step |",
             "|---|---|---|---|---|---|---|"]
    for party in PARTIES:
        for setting in DEFAULT_SETTINGS:
            cell = runs.get(setting)
            if not cell:
                continue
            rows = [cell[s]["learners"][party] for s in sorted(cell)]
            per_step = sum(r["foreign_groups"] for r in rows) / max(1, sum(r["steps"] for r in rows))
            diffs = [fmt(d) if setting != "alone" and (d := paired(runs, setting, party, m)) else "-"
                     for m in (last, over_training)]
            lines.append(f"| {party} | {setting} | {len(rows)} | {fmt([r['last'] for r in rows])} | {' | '.join(diffs)} | "
                         f"{per_step:.1f} |")
    text = "\n".join(lines) + "\n\n" + "\n".join(verdicts(runs))
    (out / "table.md").write_text(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=list(DEFAULT_SETTINGS))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--own", type=int, default=8, help="groups of its own sampler in a learner's step")
    ap.add_argument("--share", type=int, default=8, help="at most this many from each partner's sampler per step")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--eval-size", type=int, default=300)
    ap.add_argument("--settle-s", type=float, default=15.0)
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=Path("runs/paper_share_real"))
    ap.add_argument("--analyse-only", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.analyse_only:
        for seed in args.seeds:
            for setting in args.settings:
                summary = args.out / f"{setting}_s{seed}.summary.json"
                if summary.exists():
                    continue
                t0 = time.time()
                result = run_swarm(setting, seed, args)
                result["wall_s"] = round(time.time() - t0, 1)
                summary.write_text(json.dumps(result))
                print(f"{setting}_s{seed}: " + ", ".join(f"{k} {v['start']:.3f} -> {v['last']:.3f} ({v['steps']} steps)"
                                                         for k, v in result["learners"].items())
                      + f" ({result['wall_s']:.0f} s)", flush=True)
    print(analyse(args.out))


if __name__ == "__main__":
    main()
