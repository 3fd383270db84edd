"""The science scripts (examples/paper_delay, examples/paper_hetero): their statistics by hand and
their delay model. A tiny real grid end to end: tests/integration/cli/test_experiments_grid.py."""

import json
import math
from argparse import Namespace
from pathlib import Path

import pytest

from examples.paper_delay.run import (GRID_TASKS, OLDER_SETTINGS, against_table, build_config, evaluate_from, first_eval,
                                      held_out, mean_ci, run_one, run_start, settings, staleness_table, summarise, t975,
                                      tables, task_config, variants_table, versus_table)
from helpers.repo import ROOT
from swarm.delay import lognormal_params


def test_student_t_interval_by_hand():
    assert t975(2) == pytest.approx(4.303, abs=1e-3)
    assert t975(4) == pytest.approx(2.776, abs=1e-3)
    # 0.5, 0.6, 0.7: mean 0.6, sd 0.1, half-width 4.303 * 0.1 / sqrt(3) = 0.2484
    m, h = mean_ci([0.5, 0.6, 0.7])
    assert m == pytest.approx(0.6) and h == pytest.approx(0.24843, abs=1e-4)
    assert math.isnan(mean_ci([0.4])[1])  # one seed has no interval, not a zero-width one


def _summary(last: float, start: float = 0.6) -> dict:
    return {"start": start, "best": max(start, last), "last": last, "gap": max(start, last) - last, "staleness": 1.0,
            "is_var": 0.01, "kl": 0.001, "clip": 0.1, "drift": 0.25, "w_pos": 1.1, "w_neg": 0.9}


def test_differences_are_paired_by_seed_not_by_order():
    # seeds stored in different orders; paired by seed: 0.2 - 0.6 and 0.5 - 0.7 -> -0.4, -0.2:
    # mean -30 points, sd 0.1414, half-width 12.706 * 0.1414 / sqrt(2) = 127.1 (by order: sd 0.283)
    cells = {("gepo", 0): {0: _summary(0.6), 1: _summary(0.7)}, ("gepo", 64): {1: _summary(0.5), 0: _summary(0.2)},
             ("grpo", 0): {1: _summary(0.6), 0: _summary(0.6)}, ("grpo", 64): {0: _summary(0.6), 1: _summary(0.7)}}
    row = next(line for line in tables(cells, ["gepo", "grpo"], [0, 64]).splitlines() if line.startswith("| gepo | 64 |"))
    assert "| -30.0 ± 127.1 |" in row and "| 20.0 / 50.0 |" in row and "| 2/2 |" in row  # 0.6 -> 0.5 is exactly 10 pts: counted
    assert row.endswith("| 0.250 ± 0.000 | 1.100 ± 0.000 | 0.900 ± 0.000 |")  # the mechanism's diagnostics
    vs = versus_table(cells, ["gepo", "grpo"], [0, 64], "grpo")
    assert "| 64 | -30.0 ± 127.1 |" in vs  # 0.2 - 0.6 and 0.5 - 0.7 again


def test_another_grid_is_paired_cell_by_cell_on_the_seeds_both_ran():
    # bf16 grid against a float32 grid: seeds 0 and 1 in both (seed 2 only here): 0.5 - 0.6 and
    # 0.7 - 0.6 -> mean 0, sd 0.1414, half-width 127.1; grpo ran only here: no row
    here = {("gepo", 32): {0: _summary(0.5), 1: _summary(0.7), 2: _summary(0.1)}, ("grpo", 32): {0: _summary(0.6)}}
    other = {("gepo", 32): {1: _summary(0.6), 0: _summary(0.6)}}
    table = against_table(here, other, ["gepo", "grpo"], [32])
    assert "| gepo | 0.0 ± 127.1 | 0.250 ± 0.000 / 0.250 ± 0.000 |" in table
    assert "| grpo |" not in table


def test_older_summaries_without_the_drift_keys_still_tabulate():
    # grids run before the drift diagnostics existed (docs/results/delay) mix with newer runs
    old = {k: v for k, v in _summary(0.6).items() if k not in ("drift", "w_pos", "w_neg")}
    cells = {("grpo", 0): {0: old, 1: old}, ("gepo", 0): {0: old, 1: _summary(0.7)}}
    table = tables(cells, ["grpo", "gepo"], [0])
    assert next(line for line in table.splitlines() if line.startswith("| grpo | 0 |")).endswith("| - | - | - |")
    assert next(line for line in table.splitlines() if line.startswith("| gepo | 0 |")).endswith("| 0.250 | 1.100 | 0.900 |")


def test_a_variant_is_paired_with_its_base_loss():
    # gepo+kl ran only at 64: its online pairing falls back to gepo's online runs (the same loss at
    # ratio 1), and the variants table differences it with gepo at 64 seed by seed
    cells = {("gepo", 0): {0: _summary(0.6), 1: _summary(0.7)}, ("gepo", 64): {0: _summary(0.2), 1: _summary(0.5)},
             ("gepo+kl", 64): {1: _summary(0.6), 0: _summary(0.3)}}
    row = next(line for line in tables(cells, ["gepo+kl"], [64]).splitlines() if line.startswith("| gepo+kl | 64 |"))
    assert "| -20.0 ± 127.1 |" in row  # 0.3 - 0.6 and 0.6 - 0.7: -0.3, -0.1
    assert "| gepo+kl | gepo | 64 | 2 | 10.0 ± 0.0 | +10.0 / +10.0 |" in variants_table(cells, [0, 64])


def test_the_staleness_table_bins_every_step_by_its_staleness():
    # per_step rows: (staleness, IS-weight variance, k3); bins [0, 1), [1, 3), [3, 5), ...
    steps = [(0, 0.0, 0.0), (0, 0.0, 0.0), (0, 0.0, 0.0), (1, 0.1, 1.0), (2, 0.2, 2.0), (2.5, 0.3, 3.0), (4, 9.0, 9.0)]
    cells = {("grpo", 0): {0: {"per_step": steps[:3]}}, ("grpo", 8): {0: {"per_step": steps[3:5]}, 1: {"per_step": steps[5:]}}}
    table = staleness_table(cells, ["grpo", "pg"], [0, 8])
    # [1, 3): staleness 1, 2, 2.5 -> k3 mean 2, variance mean 0.2; [3, 5) has one step (< 3): blank, so not a column
    assert "| grpo | k3 | 0 | 2 |" in table and "| grpo | weight var | 0 | 0.2 |" in table
    assert "[3, 5)" not in table and "pg" not in table


def test_t_quantiles_without_scipy(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_scipy(name, *a, **kw):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    assert t975(2) == 4.303 and t975(10) == 2.228 and t975(30) == 2.042 and t975(200) == 1.96


def _args(**kw) -> Namespace:
    base = dict(lr=3e-5, groups=8, eval_every=20, eval_size=200, model="builtin:tiny-chain", task="chain",
                group_size=8, max_new_tokens=128, samplers=2, steps=60, threads=1, device="cpu", sampler_dtype="float32",
                temperature=1.0, top_p=1.0, top_k=0, lag=False, behaviour_logprobs="sampler", rollout_is_cap=0.0,
                sampler_logit_error=0.0, sampler_matmul="float32", evals="all")
    return Namespace(**{**base, **kw})


def test_max_delay_scales_the_papers_delay_distribution():
    cfg = build_config("gepo", 64, 0, _args(), "/dev/null")
    d = cfg.samplers[0].weight_delay
    # the paper's 60 s .. 1920 s (ratio 32) at 0.995, its upper bound moved to D learner steps
    assert (d.kind, d.lower_s, d.upper_s, d.confidence) == ("lognormal", 64 * 30 / 32, 64 * 30, 0.995)
    assert cfg.max_delay_steps == 64 and cfg.seconds_per_step == 30
    mu, sigma = lognormal_params(d.lower_s, d.upper_s, d.confidence)
    assert math.exp(mu) / 30 == pytest.approx(64 / math.sqrt(32))  # median delay D / sqrt(32) steps
    assert cfg.learner.max_staleness >= 128  # an honest old rollout is never dropped for its age
    online = build_config("grpo", 0, 0, _args(), "/dev/null")
    assert online.samplers[0].weight_delay.kind == "none" and online.max_delay_steps == 0


def test_a_lag_pins_every_rollout_at_the_delay_and_the_sampling_flags_reach_the_samplers():
    cfg = build_config("grpo-paper", 32, 0, _args(lag=True, temperature=0.6, top_p=0.95, top_k=20), "/dev/null")
    spec = cfg.samplers[0]
    assert spec.weight_delay.kind == "none"  # samplers load every version at once...
    assert (spec.rollout_delay.kind, spec.rollout_delay.fixed_s) == ("fixed", 32 * 30)  # ...their rollouts arrive D late
    assert (cfg.sampling.temperature, cfg.sampling.top_p, cfg.sampling.top_k) == (0.6, 0.95, 20)
    online = build_config("grpo-paper", 0, 0, _args(lag=True), "/dev/null").samplers[0]
    assert online.rollout_delay.kind == "none" and online.weight_delay.kind == "none"
    assert cfg.learner.behaviour.source == "sampler" and cfg.learner.behaviour.rollout_is_cap == 0  # as the older cells ran
    assert build_config("grpo", 32, 0, _args(behaviour_logprobs="learner"), "/dev/null").learner.behaviour.source == "learner"
    assert build_config("grpo", 0, 0, _args(sampler_logit_error=0.3), "/dev/null").samplers[0].logit_error == 0.3


def test_variants_set_the_reference_codes_knobs():
    paper = build_config("grpo-paper", 8, 0, _args(), "/dev/null").learner
    assert (paper.own_loss, paper.own_options) == ("grpo", {"dual_clip": math.inf, "normalize_std": False, "beta": 0.005})
    assert build_config("gepo+kl", 8, 0, _args(), "/dev/null").learner.own_options == {"beta": 0.005}
    gspo = build_config("gspo-clip0.2", 8, 0, _args(), "/dev/null").learner
    assert (gspo.own_loss, gspo.own_options) == ("gspo", {"eps_low": 0.2, "eps_high": 0.2})
    for variant, options in (("m2po-cap", {"bound": "cap"}), ("m2po-nodual", {"dual_clip": math.inf}),
                             ("m2po-released", {"bound": "cap", "dual_clip": math.inf})):
        m2po = build_config(variant, 8, 0, _args(), "/dev/null").learner
        assert (m2po.own_loss, m2po.own_options) == ("m2po", options)


def test_a_guard_suffix_turns_the_guard_on_with_its_threshold():
    plain = build_config("grpo", 8, 0, _args(), "/dev/null").learner
    assert not plain.guard.enabled
    guarded = build_config("grpo+guard", 8, 0, _args(), "/dev/null").learner
    assert guarded.own_loss == "grpo" and guarded.guard.enabled and guarded.guard.kl_high == 0.05
    low = build_config("gepo-released+guard@0.02", 8, 0, _args(), "/dev/null").learner
    assert (low.own_loss, low.own_options["e_hat_rows"]) == ("gepo", 8)
    assert low.guard.enabled and low.guard.kl_high == 0.02 and low.guard.kl_low == pytest.approx(0.008, rel=1e-12)
    with pytest.raises(ValueError, match="guard suffix"):
        build_config("grpo+guardx", 8, 0, _args(), "/dev/null")


# ---- evaluations: how many problems, at which steps ------------------------------------------------

def test_the_default_task_holds_the_protocols_1200_held_out_problems_and_arith_does_not():
    assert held_out("chain") == 3068  # run.py's default task: --eval-size 1200 takes 1,200 of them
    assert held_out("arith") == 1078  # run.py refuses --eval-size 1200 there rather than evaluate 1,078
    assert held_out("chain-long") == 3077  # the second model's task holds the protocol's 1,200 too


@pytest.mark.parametrize("task", ["chain", "chain-long"])
def test_a_tasks_longest_worked_completion_fits_its_token_budget_and_the_models_positions(task):
    # a completion cut at --max-new-tokens earns no reward: the budget must hold the longest reference
    # answer (character tokens, and the end of sequence) with room to spare, and prompt + budget the
    # default model's positions
    from node.models import build_char_tokenizer, resolve_model_path
    from node.tasks import ChainTask, make_task

    model, max_new = GRID_TASKS[task]
    problems = [p for split in ("train", "eval") for p in make_task(task_config(task)).split(split)]
    tok = build_char_tokenizer()
    longest = max(len(tok(ChainTask.worked(p), add_special_tokens=False)["input_ids"]) + 1 for p in problems)
    prompt = max(len(tok(p.prompt, add_special_tokens=False)["input_ids"]) for p in problems)
    positions = json.loads((Path(resolve_model_path(model)) / "config.json").read_text())["max_position_embeddings"]
    assert 1.5 * longest <= max_new and prompt + max_new <= positions


def test_runs_evaluate_from_the_protocols_burn_in():
    # B = max(ceil(T / 5), L): 300 steps -> 60; under a pinned lag of 128 -> 128; without --lag no L
    assert first_eval(_args(evals="burn-in", steps=300, lag=True), 128) == 128
    assert first_eval(_args(evals="burn-in", steps=300), 128) == 60
    assert first_eval(_args(evals="burn-in-no-start", steps=150, lag=True), 0) == 30
    assert first_eval(_args(evals="all", steps=300, lag=True), 128) == 0

    class Learner:
        version, asked = 0, []

        def run_eval(self) -> float:
            self.asked.append(self.version)
            return 0.5

    learner = Learner()
    evaluate_from(learner, 60)
    got = []
    for learner.version in (0, 20, 40, 60, 80, 300):  # what the simulator asks for, eval_every 20
        got.append(learner.run_eval())
    assert learner.asked == [60, 80, 300] and got[3:] == [0.5] * 3 and all(math.isnan(x) for x in got[:3])


def _history(evals, masked=(0.25, 0.75)):
    steps = [{"kind": "step", "version": v + 1, "staleness_mean": 0.0, "routes": {"own": {"masked_frac": m}}}
             for v, m in enumerate(masked)]
    steps[0]["truncated_frac"] = 0.1  # a figure the trainer averages over routes sits in the record itself
    return steps + [{"kind": "eval", "version": v, "eval_acc": a} for v, a in evals]


def test_the_summary_takes_the_grids_step0_evaluation_and_keeps_the_runs_own_evals():
    s = summarise(_history([(2, 0.70), (3, 0.65)]), start=0.6)
    assert (s["start"], s["best"], s["last"]) == (0.6, 0.70, 0.65) and s["gap"] == pytest.approx(0.05)
    assert s["evals"] == [(2, 0.70), (3, 0.65)]  # what protocol.py reads: the run's own
    assert s["masked"] == pytest.approx(0.5) and s["truncated"] == pytest.approx(0.1)  # (0.25 + 0.75) / 2; one step has it
    s = summarise(_history([(2, 0.50), (3, 0.45)]), start=0.6)  # the start stays the best of a run that fell
    assert (s["best"], s["gap"]) == (0.6, pytest.approx(0.15))
    no_start = summarise(_history([(2, 0.70), (3, 0.65)]))  # burn-in-no-start
    assert math.isnan(no_start["start"]) and no_start["best"] == 0.70
    own = summarise(_history([(0, 0.55), (3, 0.65)]), start=0.6)  # a run's own step-0 evaluation wins
    assert own["start"] == 0.55 and own["evals"] == [(0, 0.55), (3, 0.65)]


def test_settings_record_the_schedule_and_older_summaries_read_as_every_step():
    assert settings(_args(evals="burn-in"))["evals"] == "burn-in"
    old = json.loads((ROOT / "docs/results/delay/grpo_d0_s0.summary.json").read_text())["settings"]
    assert "evals" not in old  # run before the option: every evaluation, on 200 problems
    assert {**OLDER_SETTINGS, **old} == settings(_args(eval_size=200))


class _Learner:
    """The learner's side of an evaluation as the simulator drives it (node/learner/learner.py calls
    `self.run_eval()` every eval_every steps, cli/simulate.py at step 0 and at the end)."""

    def __init__(self) -> None:
        self.version, self.history = 0, []

    def run_eval(self) -> float:
        acc = 0.5 + self.version / 1000
        self.history.append({"kind": "eval", "version": self.version, "eval_acc": acc})
        return acc


class _Simulator:
    def __init__(self, cfg) -> None:
        self.cfg, self.learner, self.metrics = cfg, _Learner(), Namespace(close=lambda: None)
        self.sampler_matmul = "native"  # (what a summary's `kernels` records)

    def run(self) -> list[dict]:
        learner, every = self.learner, self.cfg.learner.eval_every
        learner.run_eval()
        while learner.version < self.cfg.steps:
            learner.version += 1
            learner.history.append({"kind": "step", "version": learner.version, "staleness_mean": 0.0})
            if every and learner.version % every == 0:
                learner.run_eval()
        if learner.history[-1]["kind"] != "eval":
            learner.run_eval()
        return learner.history


def test_a_burn_in_grid_evaluates_step0_once_and_each_run_from_its_burn_in(tmp_path, monkeypatch):
    from examples.paper_delay.reread import metrics

    monkeypatch.setattr("cli.simulate.Simulator", _Simulator)
    args = vars(_args(evals="burn-in", steps=100, lag=True, out=str(tmp_path)))
    run_start(args)
    step0 = json.loads((tmp_path / "step0.json").read_text())
    assert step0["evals"] == [[0, 0.5]] and step0["settings"] == settings(_args(evals="burn-in", steps=100, lag=True))
    run_one(("grpo", 32, 0, args))  # B = max(ceil(100 / 5), 32) = 32: evaluations at 40, 60, 80, 100
    s = json.loads((tmp_path / "grpo_d32_s0.summary.json").read_text())
    assert [v for v, _ in s["evals"]] == [40, 60, 80, 100] and s["start"] == 0.5 and s["last"] == 0.6
    assert s["kernels"] == {"sampler_matmul": "native"}  # the simulator's own record, not the flag
    # the protocol reads it: primary over steps >= 32 (all four), secondary the last three
    assert metrics(s) == (pytest.approx((0.54 + 0.56 + 0.58 + 0.6) / 4), pytest.approx((0.56 + 0.58 + 0.6) / 3))
    run_one(("grpo", 0, 0, {**args, "evals": "all"}))  # every evaluation, as before
    assert [v for v, _ in json.loads((tmp_path / "grpo_d0_s0.summary.json").read_text())["evals"]] == [0, 20, 40, 60, 80, 100]
