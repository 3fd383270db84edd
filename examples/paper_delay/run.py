"""The GEPO paper's delay experiment with seeds and 95% intervals, in the simulator.

    python examples/paper_delay/run.py                                  # the grid in RESULTS.md
    python examples/paper_delay/run.py --losses gepo grpo --delays 0 64 --seeds 0 1 --steps 60
    python examples/paper_delay/run.py --analyse-only                   # tables and plots from what ran

The paper's premise (docs/RESULTS.md, section 6): its sampling, its GRPO, staleness pinned near the cap

    python examples/paper_delay/run.py --losses grpo-paper --delays 0 32 --lag --seeds 0 1 2 3 4 --steps 150 \
        --temperature 0.6 --top-p 0.95 --top-k 20 --out runs/premise_f32             # add --sampler-dtype bfloat16
                                                                   # (and --behaviour-logprobs learner)
    python examples/paper_delay/run.py --analyse-only --out runs/premise_bf16 --against runs/premise_f32

Each cell is (loss, max delay D, seed). For D > 0 every sampler waits a log-normal delay between
D/32 and D learner steps (the paper's 60 s..1920 s shape at 0.995, scaled so its upper bound is D;
capped at D) before it loads the newest weights, then draws a fresh delay (swarm/delay.py). D = 0
is the on-policy loop. Losses are the project's (`node/algorithms`); a variant name such as
`gepo+kl` or `gspo-clip0.2` runs the reference code's setting of one knob (VARIANTS below), and
a name ending in `+guard` (e.g. `gepo+guard`) runs with the learner's divergence guard on, and
`+guard@0.02` with the guard's `kl_high` at 0.02 (its `kl_low` at 0.4x that, the default's ratio).

A run writes `<out>/<cell>.jsonl` (one line per step and eval) and `<out>/<cell>.summary.json`
when it ends: the grid is resumable, finished cells are skipped. Evaluations are greedy, on 1,200
held-out problems by default (docs/RESULTS.md, "Protocol"; `--eval-size 200` as the grids before
it ran). `--evals burn-in` evaluates each run only from the protocol's burn-in on (protocol.burn_in)
and the untrained model once per grid, in `<out>/step0.json` (`burn-in-no-start`: not at all).
The analysis reads every summary it finds and writes `table.md`, `results.json` and three plots.
`--workers 2` runs two cells at a time with one thread each (the tiny models do not use two
threads per step well). The same command runs on a GPU with a larger model: `--model` and
`--device cuda` (the simulator's engines and learner then run there).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.training.guard import GuardConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.paper_delay.protocol import burn_in  # noqa: E402  (stdlib only)

PAPER_RATIO = 32.0
"""upper / lower bound of the paper's delay distribution (1920 s / 60 s)."""
VARIANTS = {
    "gepo+kl": ("gepo", {"beta": 0.005}),  # HeteroRL_GEPO's runs: k3 KL to the behaviour policy at 0.005
    # GEPO as its authors' released code runs it (HanlardResearch/Hetero-RL, learner_script_checkpoint.py):
    "gepo-released": ("gepo", {"e_hat_rows": 8, "keep_zero_variance": True, "beta": 0.005, "dual_clip": math.inf}),
    # ...and one of its differences at a time
    "gepo-mb8": ("gepo", {"e_hat_rows": 8}),  # E_hat over shuffled blocks of 8 rows, not the prompt's group
    "gepo-zerovar": ("gepo", {"keep_zero_variance": True}),  # zero-variance groups kept (A = 0 rows)
    "gepo-nocap": ("gepo", {"beta": 0.005, "dual_clip": math.inf}),  # no dual clip, uncapped KL
    "gepo-policy": ("gepo", {}, {"take_newest": True, "wait_staleness": 32}),  # its learner's choice of data
    # ...and two at a time (none alone moved it measurably; all three did: which pair carries it?)
    "gepo-mb8-zerovar": ("gepo", {"e_hat_rows": 8, "keep_zero_variance": True}),
    "gepo-mb8-nocap": ("gepo", {"e_hat_rows": 8, "beta": 0.005, "dual_clip": math.inf}),
    "gepo-zerovar-nocap": ("gepo", {"keep_zero_variance": True, "beta": 0.005, "dual_clip": math.inf}),
    # the dual clip's truncated form (base.clipped_surrogate): past c, push back at weight c, not 0
    "gepo-trunc": ("gepo", {"dual_truncate": True}),
    "grpo-trunc": ("grpo", {"dual_truncate": True}),
    "m2po-released-trunc": ("m2po", {"bound": "cap", "dual_truncate": True}),
    "gspo-clip0.2": ("gspo", {"eps_low": 0.2, "eps_high": 0.2}),  # the reference code's GSPO baseline
    # M2PO's released code (Infini-AI-Lab/M2PO) against the paper's Algorithm 1 that `m2po` runs:
    "m2po-cap": ("m2po", {"bound": "cap"}),  # its bound: clip the candidates at sqrt(c), not drop the largest
    "m2po-nodual": ("m2po", {"dual_clip": math.inf}),  # no dual clip for A < 0
    "m2po-released": ("m2po", {"bound": "cap", "dual_clip": math.inf}),  # both
    # the GEPO authors' GRPO baseline (HanlardResearch/HeteroRL_GEPO): no dual clip, advantages r - mean
    # (not divided by the std), a k3 KL of 0.005 to the sampler's policy
    "grpo-paper": ("grpo", {"dual_clip": math.inf, "normalize_std": False, "beta": 0.005}),
    # ours, from the mechanism (node/algorithms/gepo.py): GEPO's weight as a truncated coefficient, no clip
    "gepo-decoupled": ("gepo", {"decoupled": True}),
    # ours too: GEPO's clip centred where its weight sits on-policy and narrowed by sqrt(length)
    "gepo-lenclip": ("gepo", {"len_clip": True}),
}
BINS = (0, 1, 3, 5, 9, 17, 33, 65, 129)
"""Left edges of the staleness bins for the IS-variance / KL plot."""


def cell_name(loss: str, delay: int, seed: int) -> str:
    return f"{loss}_d{delay}_s{seed}"


GUARD = "+guard"
"""A loss name ending in it runs with the learner's divergence guard (node/training/guard.py); without it
the guard is off, as in every run before the guard existed."""


def guard_of(loss: str) -> tuple[str, "GuardConfig"]:
    """(the name without its guard suffix, the guard it asks for): `x` -> off, `x+guard` -> the
    default guard, `x+guard@0.02` -> kl_high 0.02 and kl_low 0.008 (the default's 0.4 ratio)."""
    from node.training.guard import GuardConfig

    name, sep, high = loss.partition(GUARD)
    if not sep:
        return loss, GuardConfig(enabled=False)
    if not high:
        return name, GuardConfig()
    if not high.startswith("@"):
        raise ValueError(f"{loss!r}: a guard suffix is +guard or +guard@<kl_high>")
    kl_high = float(high[1:])
    return name, GuardConfig(kl_high=kl_high, kl_low=0.4 * kl_high)


def loss_and_options(loss: str) -> tuple[str, dict, dict]:
    """(the loss, its options, the learner's options) a cell name stands for."""
    name, guard = guard_of(loss)
    base, options, *learner = VARIANTS.get(name, (name, {}))
    return base, options, {**(learner[0] if learner else {}), "guard": guard}


GRID_TASKS = {  # --task -> (the model a grid runs by default, --max-new-tokens' default)
    "chain": ("builtin:tiny-chain", 128),
    # issue 61's second model and task: the same sums at 8-12 terms, so completions of 72-124
    # characters (chain's 30-80); 192, as 128 for chain, is ~1.5x the longest reference, and
    # prompt + 192 fits the model's 256 positions
    "chain-long": ("builtin:tiny-chain-long", 192),
    "arith": ("builtin:tiny-arith", 128),
}
"""The tasks a grid runs on."""


def task_config(task: str):
    from node.tasks import ArithmeticConfig, ChainConfig

    return {"chain": ChainConfig(), "chain-long": ChainConfig(min_terms=8, max_terms=12),
            "arith": ArithmeticConfig()}[task]


def held_out(task: str) -> int:
    """How many held-out problems `task` has: an evaluation takes at most that many
    (node.learner.evaluate.eval_problems), whatever --eval-size asks."""
    from node.tasks import make_task

    return len(make_task(task_config(task)).split("eval"))


def build_config(loss: str, delay: int, seed: int, args: argparse.Namespace, metrics_path: str):
    from cli.config import SimSamplerSpec, SimulatorConfig
    from node.sampling.params import SamplingConfig
    from node.learner import LearnerConfig
    from node.learner.config import BehaviourConfig
    from swarm.delay import DelayConfig

    sps = 30.0  # virtual seconds per learner step; only the ratio to the delays matters
    weights = (DelayConfig() if delay == 0 or args.lag else
               DelayConfig(kind="lognormal", lower_s=delay * sps / PAPER_RATIO, upper_s=delay * sps, confidence=0.995))
    # --lag: samplers load every version at once, and every rollout reaches the learner `delay` steps
    # after it was made: staleness pinned at the cap (the authors' runs sat near theirs: mean 26.5 of 32)
    rollouts = DelayConfig(kind="fixed", fixed_s=delay * sps) if args.lag and delay else DelayConfig()
    base, options, learner_options = loss_and_options(loss)
    learner = LearnerConfig(own_loss=base, own_options=options, lr=args.lr, groups_per_step=args.groups,
                            eval_every=args.eval_every, eval_size=args.eval_size,
                            max_staleness=max(64, 2 * delay),  # never drop an honest rollout for its age here
                            behaviour=BehaviourConfig(source=args.behaviour_logprobs, rollout_is_cap=args.rollout_is_cap),
                            **learner_options)
    return SimulatorConfig(
        model=args.model, task=task_config(args.task),
        sampling=SamplingConfig(group_size=args.group_size, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, max_new_tokens=args.max_new_tokens),
        learner=learner, samplers=(SimSamplerSpec(name="sampler", count=args.samplers, weight_delay=weights,
                                                  rollout_delay=rollouts, dtype=args.sampler_dtype, matmul=args.sampler_matmul,
                                                  logit_error=args.sampler_logit_error),),
        steps=args.steps, seconds_per_step=sps, max_delay_steps=delay, seed=seed, threads=args.threads,
        device=args.device, metrics_path=metrics_path)


def recomputed_share(steps: list[dict]) -> float:
    """Own-model groups whose behaviour log-probs the learner recomputed, over those it recomputed
    or left with their claims (NaN with --behaviour-logprobs sampler)."""
    done = sum(r.get("behaviour_recomputed", 0) for r in steps)
    left = sum(r.get("behaviour_claims_close", 0) + r.get("behaviour_claims_kept", 0) for r in steps)
    return done / (done + left) if done + left else float("nan")


def own_route(record: dict, key: str):
    """`key` of a step record, or of its own-model route's figures (a loss's diagnostic that the
    trainer does not average over routes, e.g. `masked_frac`); None if neither has it."""
    return record[key] if key in record else record.get("routes", {}).get("own", {}).get(key)


def summarise(history: list[dict], start: float | None = None) -> dict:
    """A run's summary from its records. `start`: the grid's step-0 accuracy when the run did not
    evaluate step 0 itself (--evals burn-in): `start`, `best` and `gap` then include it; `evals`
    stays the run's own evaluations, what protocol.py reads."""
    evals = [(r["version"], r["eval_acc"]) for r in history if r["kind"] == "eval"]
    steps = [r for r in history if r["kind"] == "step"]
    curve = [(0, start), *evals] if start is not None and not (evals and evals[0][0] == 0) else evals
    acc = [a for _, a in curve] or [float("nan")]

    def mean_of(key: str) -> float:
        xs = [x for r in steps if (x := own_route(r, key)) is not None and x == x]
        return statistics.fmean(xs) if xs else float("nan")

    return {
        "start": acc[0] if curve and curve[0][0] == 0 else float("nan"), "best": max(acc), "last": acc[-1],
        "gap": max(acc) - acc[-1], "evals": evals,
        "steps": len(steps), "staleness": mean_of("staleness_mean"), "is_var": mean_of("is_weight_var"),
        "kl": mean_of("kl_k3"), "clip": mean_of("clip_frac"), "reward": mean_of("reward"),
        # the mechanism: how far p moved from q per token, and the weights' mean by advantage sign
        "drift": mean_of("drift_frac"), "w_pos": mean_of("weight_mean_pos"), "w_neg": mean_of("weight_mean_neg"),
        # the share of sequences grpo_seqmask drops, of tokens tis truncates (NaN for the other losses)
        "masked": mean_of("masked_frac"), "truncated": mean_of("truncated_frac"),
        # --behaviour-logprobs learner: how far the samplers' claims sat from the learner's own
        "behaviour_k3": mean_of("behaviour_k3"), "behaviour_clip": mean_of("behaviour_clip_share"),
        # --behaviour-logprobs auto: the share of own-model groups recomputed; the claims' k3 the audits
        # (and recomputations) measured, the largest over samplers at the end
        "recomputed_share": recomputed_share(steps),
        "claims_k3": steps[-1].get("claim_gaps", {}).get("k3_max", float("nan")) if steps else float("nan"),
        "drops": steps[-1].get("drops", {}) if steps else {}, "gap_drops": steps[-1].get("logprob_gap_drops", {}) if steps else {},
        # per step, for the IS-variance / KL vs staleness plot
        "per_step": [(r.get("staleness_mean"), r.get("is_weight_var"), r.get("kl_k3")) for r in steps],
    }


SETTINGS = ("steps", "task", "model", "lr", "groups", "group_size", "max_new_tokens", "samplers", "eval_every", "eval_size",
            "sampler_dtype", "temperature", "top_p", "top_k", "lag", "behaviour_logprobs", "sampler_logit_error",
            "rollout_is_cap", "evals")
OLDER_SETTINGS = {"sampler_dtype": "float32", "temperature": 1.0, "top_p": 1.0, "top_k": 0, "lag": False,
                  "behaviour_logprobs": "sampler", "sampler_logit_error": 0.0, "rollout_is_cap": 0.0, "evals": "all"}
"""What grids run before a setting existed ran with."""


def settings(args: argparse.Namespace) -> dict:
    """What a run depends on besides its cell (loss, delay, seed): a resumed grid must not mix them."""
    return {k: getattr(args, k) for k in SETTINGS}


EVALS = {
    "all": "each run evaluates at step 0, every --eval-every steps and at its last (as every grid before issue 61)",
    "burn-in": "each run evaluates only at the --eval-every steps from the protocol's burn-in "
               "B = max(ceil(T/5), L) on and at its last; the untrained model once per grid (<out>/step0.json), "
               "which every summary's start, best and gap include",
    "burn-in-no-start": "as burn-in, without the step-0 evaluation (start is NaN; best over the run's evaluations)",
}
"""--evals: which learner steps a run evaluates at."""
STEP0 = "step0.json"
"""The grid's step-0 evaluation with --evals burn-in."""


def first_eval(args: argparse.Namespace, delay: int) -> int:
    """The first learner step a run of this grid evaluates at: 0, or the protocol's burn-in."""
    return 0 if args.evals == "all" else burn_in(args.steps, delay if args.lag else 0)


def evaluate_from(learner, first: int) -> None:
    """Make `learner` skip the evaluations the simulator asks for before step `first` (--evals).
    The simulator evaluates at step 0, every eval_every steps and at the end, with no schedule of
    its own (cli/simulate.py), so the learner's `run_eval` is wrapped here, for this run only. A
    greedy evaluation draws no randomness and leaves the model as it was, so a skipped one changes
    nothing else in the run."""
    run_eval = learner.run_eval

    def from_first() -> float:
        return run_eval() if learner.version >= first else float("nan")

    learner.run_eval = from_first


def write_atomically(path: Path, record: dict) -> None:
    """`record` as JSON at `path`, whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    tmp.rename(path)  # a killed run leaves no file, so it is re-run


def run_start(arg_dict: dict) -> str:
    """The grid's step-0 evaluation (--evals burn-in): the untrained model, evaluated as every run
    would at step 0 (its learner's run_eval). Greedy, it is the same whatever the cell's loss, delay
    or seed, so a grid makes it once."""
    import logging

    from cli.simulate import Simulator

    logging.basicConfig(level=logging.WARNING)
    args = argparse.Namespace(**arg_dict)
    out = Path(args.out)
    t = time.time()
    sim = Simulator(build_config("grpo", 0, 0, args, str(out / "step0.jsonl")))
    acc = sim.learner.run_eval()
    sim.metrics.close()
    write_atomically(out / STEP0, {"settings": settings(args), "evals": [(0, acc)], "wall_s": round(time.time() - t, 1)})
    return f"step 0, once for the grid: eval {acc:.3f} ({time.time() - t:.0f} s)"


def grid_start(out: Path, evals: str) -> float | None:
    """The grid's step-0 accuracy a run's summary includes: with --evals burn-in, from <out>/step0.json."""
    return json.loads((out / STEP0).read_text())["evals"][0][1] if evals == "burn-in" else None


def run_one(job: tuple[str, int, int, dict]) -> str:
    loss, delay, seed, arg_dict = job
    import logging

    from cli.simulate import Simulator

    logging.basicConfig(level=logging.WARNING)
    args = argparse.Namespace(**arg_dict)
    out = Path(args.out)
    name = cell_name(loss, delay, seed)
    path = out / f"{name}.jsonl"
    path.unlink(missing_ok=True)
    t = time.time()
    sim = Simulator(build_config(loss, delay, seed, args, str(path)))
    if first := first_eval(args, delay):
        evaluate_from(sim.learner, first)
    history = sim.run()
    # `kernels`: how its numbers were computed (cli.simulate.Float32Linear says how close), not what
    # it ran, so not one of the `settings` a resumed grid must not mix: it mixes machines, whose
    # kernels differ too. Runs before 2026-11-30 record none: they ran torch's ("native")
    summary = {"loss": loss, "delay": delay, "seed": seed, "settings": settings(args),
               "kernels": {"sampler_matmul": sim.sampler_matmul}, "wall_s": round(time.time() - t, 1),
               **summarise(history, grid_start(out, args.evals))}
    write_atomically(out / f"{name}.summary.json", summary)
    return (f"{name:24s} eval {summary['start']:.3f} -> best {summary['best']:.3f}, last {summary['last']:.3f}, "
            f"staleness {summary['staleness']:.1f}  ({summary['wall_s']:.0f} s)")


# ---- statistics ------------------------------------------------------------------------------

def t975(df: int) -> float:
    """Two-sided 95% Student-t quantile (scipy when present; a table otherwise)."""
    try:
        from scipy.stats import t

        return float(t.ppf(0.975, df))
    except ImportError:
        table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
                 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
                 2.045, 2.042)  # df = 1..30
        return table[df - 1] if df <= len(table) else 1.96


def mean_ci(xs: list[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t interval); half-width nan for one value."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def fmt(xs: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """Mean ± 95% half-width of the values present ("-" if none: older runs lack the drift keys)."""
    xs = [x for x in xs if x == x]
    if not xs:
        return "-"
    m, h = mean_ci(xs)
    return f"{m * scale:.{digits}f}" if h != h else f"{m * scale:.{digits}f} ± {h * scale:.{digits}f}"


# ---- analysis --------------------------------------------------------------------------------

def load(out: Path) -> dict[tuple[str, int], dict[int, dict]]:
    cells: dict[tuple[str, int], dict[int, dict]] = {}
    for p in sorted(out.glob("*.summary.json")):
        s = json.loads(p.read_text())
        cells.setdefault((s["loss"], s["delay"]), {})[s["seed"]] = s
    return cells


def tables(cells: dict, losses: list[str], delays: list[int]) -> str:
    head = ("| loss | max delay | seeds | staleness | best % | last % | last, each seed | best-last | "
            "last - same loss at 0 (paired) | ended >= 10 pts below start | IS-weight var | k3 KL | clip frac | "
            "drifted tokens | weight, A > 0 | weight, A < 0 |")
    lines = [head, "|" + "---|" * 16]
    for loss in losses:
        for d in delays:
            runs = cells.get((loss, d))
            if not runs:
                continue
            seeds = sorted(runs)
            # on-policy the ratio is 1, where every variant's loss and gradient are its base loss's:
            # a variant run only under delay is paired with its base loss's online runs
            online = cells.get((loss, 0)) or cells.get((loss_and_options(loss)[0], 0), {})
            paired = [runs[s]["last"] - online[s]["last"] for s in seeds if s in online]
            col = lambda k: [runs[s].get(k, math.nan) for s in seeds]  # noqa: E731  (older runs lack the drift keys)
            lines.append(
                f"| {loss} | {d} | {len(seeds)} | {statistics.fmean(col('staleness')):.1f} | {fmt(col('best'))} | "
                f"{fmt(col('last'))} | {' / '.join(f'{100 * x:.1f}' for x in col('last'))} | {fmt(col('gap'))} | "
                f"{fmt(paired) if d and paired else '-'} | {sum(round(r['start'] - r['last'], 6) >= 0.1 for r in runs.values())}/{len(seeds)} | "
                f"{fmt(col('is_var'), 1, 4)} | {fmt(col('kl'), 1, 4)} | {fmt(col('clip'), 1, 3)} | "
                f"{fmt(col('drift'), 1, 3)} | {fmt(col('w_pos'), 1, 3)} | {fmt(col('w_neg'), 1, 3)} |")
    return "\n".join(lines)


def versus_table(cells: dict, losses: list[str], delays: list[int], ref: str) -> str:
    """Paired by seed: last accuracy of each loss minus `ref`'s at the same delay and seed."""
    lines = ["| max delay | " + " | ".join(f"{loss} - {ref}" for loss in losses if loss != ref) + " |",
             "|---|" + "---|" * (len(losses) - 1)]
    for d in delays:
        base = cells.get((ref, d), {})
        row = []
        for loss in losses:
            if loss == ref:
                continue
            runs = cells.get((loss, d), {})
            diffs = [runs[s]["last"] - base[s]["last"] for s in sorted(runs) if s in base]
            row.append(fmt(diffs) if diffs else "-")
        lines.append(f"| {d} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def against_table(cells: dict, other: dict, losses: list[str], delays: list[int]) -> str:
    """Paired by (loss, delay, seed): last accuracy here minus the same cell's in another grid (the
    same regime with float32 samplers, say), and the share of drifted tokens in both."""
    lines = ["| loss | " + " | ".join(f"max delay {d}: last - other (paired) | drifted tokens, here / other" for d in delays)
             + " |", "|---|" + "---|---|" * len(delays)]
    for loss in losses:
        row = []
        for d in delays:
            here, there = cells.get((loss, d), {}), other.get((loss, d), {})
            seeds = [x for x in sorted(here) if x in there]
            drift = lambda runs: fmt([runs[x].get("drift", math.nan) for x in seeds], 1, 3)  # noqa: E731
            row += [fmt([here[x]["last"] - there[x]["last"] for x in seeds]), f"{drift(here)} / {drift(there)}"] \
                if seeds else ["-", "-"]
        if any(c != "-" for c in row):
            lines.append(f"| {loss} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def binned(cells: dict, loss: str, delays: list[int], idx: int) -> list[tuple[float, float] | None]:
    """Per staleness bin (BINS), (mean staleness, mean value) of per-step column `idx` (1: IS-weight
    variance, 2: k3) over every step of `loss`'s runs at `delays`; None for a bin of < 3 steps."""
    pts = [p for d in delays for r in cells.get((loss, d), {}).values() for p in r["per_step"]
           if p[0] is not None and p[idx] is not None and p[idx] == p[idx]]
    out: list[tuple[float, float] | None] = []
    for lo, hi in zip(BINS, BINS[1:] + (10**9,)):
        inside = [p for p in pts if lo <= p[0] < hi]
        out.append((statistics.fmean(p[0] for p in inside), statistics.fmean(p[idx] for p in inside))
                   if len(inside) >= 3 else None)
    return out


def staleness_table(cells: dict, losses: list[str], delays: list[int]) -> str:
    """The numbers behind the Figure 5 plot: each loss's mean k3 and IS-weight variance per bin of
    the step's mean staleness (all delays and seeds pooled)."""
    rows = [(loss, quantity, binned(cells, loss, delays, idx)) for idx, quantity in ((2, "k3"), (1, "weight var"))
            for loss in losses]
    rows = [r for r in rows if any(b and b[1] for b in r[2])]  # pg has no importance weights
    used = [i for i in range(len(BINS)) if any(r[2][i] for r in rows)]
    edges = list(zip(BINS, BINS[1:] + (None,)))
    lines = ["| loss | quantity | " + " | ".join(f"[{edges[i][0]}, {edges[i][1]})" if edges[i][1] else f">= {edges[i][0]}"
                                                for i in used) + " |",
             "|---|---|" + "---|" * len(used)]
    for loss, quantity, bins in rows:
        lines.append(f"| {loss} | {quantity} | " + " | ".join(f"{bins[i][1]:.3g}" if bins[i] else "" for i in used) + " |")
    return "\n".join(lines)


def variants_table(cells: dict, delays: list[int]) -> str:
    """Paired by seed: last accuracy of each variant minus its base loss's at the same delay and seed."""
    lines = ["| variant | base | max delay | seeds | variant - base (points) | each seed |", "|" + "---|" * 6]
    for variant in sorted({k[0] for k in cells} & set(VARIANTS)):
        base = VARIANTS[variant][0]
        for d in delays:
            runs, ref = cells.get((variant, d), {}), cells.get((base, d), {})
            diffs = [runs[s]["last"] - ref[s]["last"] for s in sorted(runs) if s in ref]
            if diffs:
                lines.append(f"| {variant} | {base} | {d} | {len(diffs)} | {fmt(diffs)} | "
                             f"{' / '.join(f'{100 * x:+.1f}' for x in diffs)} |")
    return "\n".join(lines)


def eval_band(ax, runs: list[dict], label: str, color: str | None = None) -> None:
    """Mean eval accuracy of `runs` (summaries of one cell, one per seed) over training, with its
    95% band clipped to [0, 1]; nothing for no runs."""
    if not runs:
        return
    n = min(len(r["evals"]) for r in runs)
    xs = [runs[0]["evals"][i][0] for i in range(n)]
    stats = [mean_ci([r["evals"][i][1] for r in runs]) for i in range(n)]
    m = [s[0] for s in stats]
    h = [0 if s[1] != s[1] else s[1] for s in stats]
    ax.plot(xs, m, label=label, color=color)
    ax.fill_between(xs, [max(0.0, a - b) for a, b in zip(m, h)], [min(1.0, a + b) for a, b in zip(m, h)], alpha=0.15,
                    color=color)


def plots(out: Path, cells: dict, losses: list[str], delays: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # 1. eval accuracy over training, mean over seeds with the 95% band, one panel per loss
    cols = min(3, len(losses))
    rows = -(-len(losses) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(losses):]:
        ax.set_visible(False)
    for ax, loss in zip(axes.flat, losses):
        for i, d in enumerate(delays):  # one colour per delay in every panel, so the one legend reads them all
            eval_band(ax, list(cells.get((loss, d), {}).values()), f"max delay {d}", f"C{i % 10}")
        ax.set_title(loss)
        ax.set_ylim(0, 1)
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("greedy eval accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "eval_curves.png", dpi=110)
    plt.close(fig)

    # 2. last / best accuracy against the max delay, 95% intervals over seeds
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key in zip(axes, ("best", "last")):
        for loss in losses:
            ds = [d for d in delays if cells.get((loss, d))]
            stats = [mean_ci([r[key] for r in cells[(loss, d)].values()]) for d in ds]
            ax.errorbar([str(d) for d in ds], [s[0] for s in stats], yerr=[0 if s[1] != s[1] else s[1] for s in stats],
                        capsize=3, marker="o", label=loss)
        ax.set_xlabel("max delay (learner steps)")
        ax.set_ylabel(f"{key} greedy eval accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_delay.png", dpi=110)
    plt.close(fig)

    # 3. the paper's Figure 5: IS-weight variance and KL against the staleness of the step's rollouts
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, idx, label in zip(axes, (1, 2), ("IS-weight variance", "k3 of l^q - l^p per token (~ KL(q || p) when small)")):
        for loss in losses:
            bins = [b for b in binned(cells, loss, delays, idx) if b]
            xs, ys = [b[0] for b in bins], [b[1] for b in bins]
            if any(ys):  # pg has no importance weights: nothing to draw in the left panel
                # one colour per loss in both panels, though the left one skips pg
                ax.plot([x + 0.5 for x in xs], ys, marker="o", label=loss, color=f"C{losses.index(loss) % 10}")
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=1e-4)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("mean staleness of the step's rollouts + 0.5 (versions)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "is_var_kl_vs_staleness.png", dpi=110)
    plt.close(fig)


def analyse(out: Path, losses: list[str], delays: list[int], against: Path | None = None) -> str:
    cells = load(out)
    if not cells:
        raise SystemExit(f"no finished runs under {out}: run the grid first")
    asked = [x for x in losses if any(k[0] == x for k in cells)]
    losses = asked + sorted({k[0] for k in cells} - set(losses))  # tables: every loss that ran
    delays = sorted({k[1] for k in cells} | set(d for d in delays if any(k[1] == d for k in cells)))
    any_run = next(iter(next(iter(cells.values())).values()))
    text = (f"{any_run['steps']} learner steps per run; accuracy in % (greedy, held-out); "
            f"mean ± 95% t-interval over seeds.\n\n{tables(cells, losses, delays)}\n")
    if "grpo" in losses:
        text += f"\nLast accuracy minus GRPO's at the same delay and seed (points, paired):\n\n{versus_table(cells, losses, delays, 'grpo')}\n"
    text += ("\nMean k3 and IS-weight variance per bin of the step's mean staleness (versions; all delays and "
             f"seeds pooled; blank: < 3 steps):\n\n{staleness_table(cells, losses, delays)}\n")
    if set(VARIANTS) & set(losses):
        text += f"\nLast accuracy of each variant minus its base loss's at the same delay and seed (paired):\n\n{variants_table(cells, delays)}\n"
    if against is not None:
        text += (f"\nLast accuracy minus the same loss, delay and seed under {against} (points, paired):\n\n"
                 f"{against_table(cells, load(against), losses, delays)}\n")
    (out / "table.md").write_text(text)
    (out / "results.json").write_text(json.dumps(
        {f"{k[0]}|{k[1]}": {str(s): {x: v for x, v in r.items() if x != "per_step"} for s, r in runs.items()}
         for k, runs in cells.items()}, indent=1))
    plots(out, cells, asked or losses, delays)  # plots: the losses asked for (thirty would be unreadable)
    return text


def main() -> None:
    from cli.procs import grid_pool

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--losses", nargs="+", default=["gepo", "grpo", "gspo", "m2po", "pg"],
                    help=f"stale-rollout losses (node/algorithms) or variants {sorted(VARIANTS)}")
    ap.add_argument("--delays", type=int, nargs="+", default=[0, 16, 64, 256], help="max delays in learner steps (0 = online)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--task", choices=list(GRID_TASKS), default="chain",
                    help="chain: sums of 4-8 two-digit numbers on a scratchpad; chain-long: of 8-12; arith: 1-4 token answers")
    ap.add_argument("--model", default="",
                    help="default: " + ", ".join(f"{model} ({task})" for task, (model, _) in GRID_TASKS.items()))
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--groups", type=int, default=8, help="groups (prompts) per learner step")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=0,
                    help="tokens a completion may take; 0, the default: by task, "
                         + ", ".join(f"{n} ({task})" for task, (_, n) in GRID_TASKS.items()))
    ap.add_argument("--samplers", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--eval-size", type=int, default=1200,
                    help="held-out problems per evaluation: 1,200 by the protocol (docs/RESULTS.md; one evaluation's "
                         "binomial SD under 1.5 points), 200 as the grids before it ran")
    ap.add_argument("--evals", choices=list(EVALS), default="all",
                    help="; ".join(f"{k}: {v}" for k, v in EVALS.items()))
    ap.add_argument("--workers", type=int, default=2, help="cells run at once, each in its own process")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per cell")
    ap.add_argument("--device", default="cpu", help="where the samplers' engines and the learner run (cuda on a GPU)")
    ap.add_argument("--sampler-dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the samplers' engine precision (bfloat16: a GPU volunteer's; the learner stays float32)")
    ap.add_argument("--sampler-matmul", default="float32", choices=["float32", "native"],
                    help="with --sampler-dtype bfloat16/float16 on a CPU: each linear layer multiplies in float32 and "
                         "rounds once (as a GPU's bf16 GEMM) or with torch's kernel for the dtype, 3.2x slower "
                         "(cli.config.SimSamplerSpec.matmul; each summary's `kernels` records what ran, not a setting: see run_one)")
    ap.add_argument("--sampler-logit-error", type=float, default=0.0,
                    help="std (logits) of Gaussian noise the samplers' engines add to every logit: a larger model's "
                         "low-precision error on this one (cli.config.SimSamplerSpec.logit_error)")
    ap.add_argument("--behaviour-logprobs", default="sampler", choices=["sampler", "learner", "auto"],
                    help="q of the losses' ratios: the samplers' claims, the learner's own recomputation at each "
                         "group's version, or that for samplers whose claims sit far (learner.behaviour.source; "
                         "the grids' default stays the claims, as their older cells ran)")
    ap.add_argument("--rollout-is-cap", type=float, default=0.0,
                    help="with --behaviour-logprobs learner or auto: weigh each recomputed token by ours / claimed "
                         "within [1/cap, cap], the rollout correction (learner.behaviour.rollout_is_cap; 0: off, as the older cells ran)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the authors': 0.6)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (the authors': 0.95)")
    ap.add_argument("--top-k", type=int, default=0, help="top-k sampling, 0 = off (the authors': 20)")
    ap.add_argument("--lag", action="store_true",
                    help="delay D is a constant lag: every rollout reaches the learner D steps after it was made "
                         "(samplers load each version at once), so staleness sits at D, not spread below it")
    ap.add_argument("--out", type=Path, default=Path("runs/paper_delay"))
    ap.add_argument("--analyse-only", action="store_true")
    ap.add_argument("--against", type=Path,
                    help="the tables also pair each cell with the same cell of this grid's --out (another regime)")
    args = ap.parse_args()
    if not args.model:
        args.model = GRID_TASKS[args.task][0]
    args.max_new_tokens = args.max_new_tokens or GRID_TASKS[args.task][1]
    for loss in args.losses:
        from node.algorithms import get_algorithm

        try:
            get_algorithm(loss_and_options(loss)[0])  # a typo fails now, not an hour into the grid
        except ValueError as e:
            raise SystemExit(f"--losses {loss}: {e}") from None
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.analyse_only:
        if args.eval_size > (held := held_out(args.task)):
            raise SystemExit(f"--eval-size {args.eval_size}: --task {args.task} holds out {held} problems; "
                             f"give --eval-size {held} or less")
        done = {p.name: json.loads(p.read_text()) for p in [*args.out.glob("*.summary.json"), args.out / STEP0]
                if p.exists()}
        for name, s in done.items():
            if {**OLDER_SETTINGS, **s.get("settings", {})} != settings(args):
                raise SystemExit(f"{args.out}/{name} was run with {s.get('settings')}, not {settings(args)}: "
                                 "give the same settings or another --out")
        todo = [(loss, d, s) for s in args.seeds for d in args.delays for loss in args.losses
                if f"{cell_name(loss, d, s)}.summary.json" not in done]
        print(f"{len(todo)} runs to do under {args.out} ({args.workers} at a time)", flush=True)
        arg_dict = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        t0 = time.time()
        with grid_pool(args.workers) as pool:  # no worker outlives this process, however it ends
            if todo and args.evals == "burn-in" and STEP0 not in done:  # before the runs: their summaries read it
                print(pool.apply(run_start, (arg_dict,)), flush=True)
            for i, line in enumerate(pool.imap_unordered(run_one, [(*j, arg_dict) for j in todo])):
                print(f"[{i + 1}/{len(todo)} {time.time() - t0:.0f} s] {line}", flush=True)
    print(analyse(args.out, args.losses, args.delays, args.against))
    print(f"saved {args.out}/table.md, results.json, eval_curves.png, accuracy_vs_delay.png, is_var_kl_vs_staleness.png")


if __name__ == "__main__":
    main()
