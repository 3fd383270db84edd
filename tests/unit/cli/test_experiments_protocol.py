"""Issue 61's protocol (examples/paper_delay/protocol.py) by hand, and its re-read of the summaries
(examples/paper_delay/reread.py) on a tiny folder of them. Every expected value is worked out in
the comment beside it (t values from the closed forms of Student's t at 1, 2 and 4 df)."""

import json
import math

import pytest

from examples.paper_delay.protocol import (Difference, burn_in, detectable, holm, late_gain, non_inferior, paired,
                                           pairing_ratio, pooled_sd, power_of, primary, sd, secondary, seeds_per_cell,
                                           t_cdf, t_quantile, welch)
from examples.paper_delay.run import load
from examples.paper_delay.reread import Regime, cells_of, collect, compare, metrics

EVALS = [(0, 0.60), (20, 0.62), (40, 0.70), (60, 0.74)]


def test_the_burn_in_is_a_fifth_of_the_run_and_at_least_a_pinned_lag():
    assert burn_in(150) == 30 and burn_in(60) == 12 and burn_in(300) == 60  # ceil(0.2 T)
    assert burn_in(150, lag=32) == 32 and burn_in(300, lag=128) == 128  # staleness ramps up to the lag first


def test_primary_is_the_mean_from_the_burn_in_and_secondary_the_last_three():
    assert primary(EVALS, 30) == pytest.approx((0.70 + 0.74) / 2)  # 0.72: steps 40 and 60
    assert primary(EVALS, 20) == pytest.approx((0.62 + 0.70 + 0.74) / 3)  # a step at the burn-in counts
    assert secondary(EVALS) == pytest.approx((0.62 + 0.70 + 0.74) / 3)  # 0.686667
    with pytest.raises(ValueError, match="burn-in"):
        primary(EVALS, 61)
    with pytest.raises(ValueError, match="needs 3"):
        secondary(EVALS[:2])


def test_the_late_gain_is_the_last_thirds_slope_times_its_span():
    # last third of 300 steps: steps 200, 250, 300 at 0.70, 0.74, 0.75; mean step 250, mean 0.73;
    # slope (-50 * -0.03 + 0 + 50 * 0.02) / (2 * 50^2) = 2.5 / 5000 = 5e-4 a step; x 100 steps = 0.05
    curve = [(0, 0.60), (100, 0.65), (200, 0.70), (250, 0.74), (300, 0.75)]
    assert late_gain(curve) == pytest.approx(0.05)


def test_student_t_against_its_closed_forms():
    assert t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1) / pi
    assert t_cdf(2.0, 2) == pytest.approx(0.5 + 1 / math.sqrt(6), abs=1e-12)  # 1/2 + t / (2 sqrt(2 + t^2))
    assert t_cdf(-2.0, 2) == pytest.approx(0.5 - 1 / math.sqrt(6), abs=1e-12)
    # 4 df: 1/2 + 3/8 * t / sqrt(1 + t^2/4) * (1 - t^2 / (12 (1 + t^2/4))); t^2 = 6: 1/2 + 3/8 * sqrt(6/2.5) * 0.8
    assert t_cdf(math.sqrt(6), 4) == pytest.approx(0.5 + 0.375 * math.sqrt(6 / 2.5) * 0.8, abs=1e-12)  # 0.964758
    # the 2-df quantile inverted by hand: t / sqrt(2 + t^2) = 0.95 -> t^2 = 2 * 0.9025 / 0.0975
    assert t_quantile(0.975, 2) == pytest.approx(math.sqrt(2 * 0.9025 / 0.0975), abs=1e-9)  # 4.302653
    assert t_quantile(0.025, 2) == pytest.approx(-math.sqrt(2 * 0.9025 / 0.0975), abs=1e-9)
    assert t_quantile(0.75, 1) == pytest.approx(1.0, abs=1e-9)  # tan(pi / 4)


def test_welch_by_hand():
    # equal variances and seeds: diff -2, se sqrt(1/3 + 1/3), df (2/3)^2 / (2 (1/3)^2 / 2) = 4, so t^2 = 6:
    # p = 2 (1 - 0.964758) (above), half-width t_975(4) * se = 2.776445 * 0.816497
    d = welch([1, 2, 3], [3, 4, 5])
    assert (d.mean, d.df) == (-2, pytest.approx(4.0))
    assert d.p == pytest.approx(2 * (0.5 - 0.375 * math.sqrt(6 / 2.5) * 0.8), abs=1e-9)  # 0.070484
    assert d.half == pytest.approx(2.776445 * math.sqrt(2 / 3), abs=1e-5)  # 2.266958
    assert (d.low, d.high) == (pytest.approx(-2 - d.half), pytest.approx(-2 + d.half))
    # unequal: var/n = 1/3 and 10/5 = 2; df = (7/3)^2 / ((1/3)^2 / 2 + 2^2 / 4) = (49/9) / (19/18) = 98/19
    assert welch([1, 2, 3], [2, 4, 6, 8, 10]).df == pytest.approx(98 / 19)
    with pytest.raises(ValueError, match="2\\+ seeds"):
        welch([1], [2, 3])


def test_paired_by_hand_and_what_pairing_buys():
    # differences 1, 0, 2: mean 1, sd 1, se 1/sqrt(3), 2 df: t = sqrt(3), F = 1/2 + sqrt(3) / (2 sqrt(5)),
    # p = 1 - sqrt(3/5) = 0.225403; half-width 4.302653 / sqrt(3) = 2.484138
    d = paired([1, 2, 4], [0, 2, 2])
    assert d.mean == pytest.approx(1.0) and d.df == 2
    assert d.p == pytest.approx(1 - math.sqrt(0.6), abs=1e-9)
    assert d.half == pytest.approx(math.sqrt(2 * 0.9025 / 0.0975) / math.sqrt(3), abs=1e-9)
    # var(diff) 1 over var a + var b = 7/3 + 4/3 -> 3/11; pooled with a pair of identical cells
    # (var diff 0, vars 1 + 1): (1 + 0) / (11/3 + 2) = 3/17
    assert pairing_ratio([([1, 2, 4], [0, 2, 2])]) == pytest.approx(3 / 11)
    assert pairing_ratio([([1, 2, 4], [0, 2, 2]), ([1, 2, 3], [1, 2, 3])]) == pytest.approx(3 / 17)


def test_non_inferiority_asks_the_intervals_lower_end_to_clear_the_margin():
    assert non_inferior(Difference(-0.01, 0.019, 8, 0.3), 0.03)  # lower end -0.029 > -0.03
    assert not non_inferior(Difference(-0.01, 0.021, 8, 0.3), 0.03)  # -0.031
    assert not non_inferior(Difference(0.05, 0.09, 8, 0.3), 0.03)  # a wide interval proves nothing


def test_power_and_seeds_per_cell_by_hand():
    # normal limit: (z_0.975 + z_0.8) * se = (1.959964 + 0.841621) * 1
    assert detectable(1.0, 1e9) == pytest.approx(2.801585, abs=1e-5)
    assert power_of(2.801585, 1.0, 1e9) == pytest.approx(0.8, abs=1e-5)
    # 4 df (tables): t_0.975 = 2.776, t_0.8 = 0.941
    assert detectable(1.0, 4) == pytest.approx(2.776 + 0.941, abs=2e-3)
    # d = 1 SD: 16 seeds fail, (t_975 + t_80 at 30 df = 2.042 + 0.854) * sqrt(2/16) = 1.024 > 1;
    # 17 pass, (2.037 + 0.853 at 32 df) * sqrt(2/17) = 0.991 (the noncentral-t answer is 17 too)
    assert seeds_per_cell(1.0, 1.0) == 17 and seeds_per_cell(0.025, 0.025) == 17
    # d = 2 SD: 5 fail, (2.306 + 0.889) * sqrt(2/5) = 2.021 > 2; 6 pass, (2.228 + 0.879) * sqrt(1/3) = 1.794
    assert seeds_per_cell(1.0, 2.0) == 6
    # Bonferroni's level (Holm's first step) asks more: at 0.05 / 48 and d = 1 SD, 37 (noncentral t: 37)
    assert seeds_per_cell(1.0, 1.0, alpha=0.05 / 48) == 37


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 scaled by 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.6, 0.9]) == [1.0, 1.0]  # capped at 1
    assert holm([0.04]) == [0.04]  # a family of one is the test itself


def test_between_seed_and_pooled_sd():
    assert sd([0.5, 0.6, 0.7]) == pytest.approx(0.1) and math.isnan(sd([0.4]))
    # (2 * 1 + 4 * 10) / (2 + 4) = 7; a one-seed cell adds nothing
    assert pooled_sd([[1, 2, 3], [2, 4, 6, 8, 10], [5]]) == pytest.approx(math.sqrt(7))


def _write(folder, loss, delay, seed, evals, lag=False, steps=60, start=None):
    folder.mkdir(parents=True, exist_ok=True)
    s = {"loss": loss, "delay": delay, "seed": seed, "steps": steps, "settings": {"steps": steps, "lag": lag},
         "evals": evals, "start": start}
    (folder / f"{loss}_d{delay}_s{seed}.summary.json").write_text(json.dumps(s))


def test_a_pinned_lag_moves_the_burn_in_and_a_rerun_replaces_its_seed(tmp_path):
    lagged = [(0, 0.6), (20, 0.0), (40, 0.7), (60, 0.8)]  # under lag 32 step 20 is burn-in: (0.7 + 0.8) / 2
    assert metrics({"steps": 60, "delay": 32, "settings": {"steps": 60, "lag": True}, "evals": lagged}) == \
        (pytest.approx(0.75), pytest.approx(0.5))
    assert metrics({"steps": 60, "delay": 32, "evals": lagged})[0] == pytest.approx(0.5)  # no lag: 20, 40, 60
    _write(tmp_path / "claims", "grpo", 0, 0, EVALS)
    _write(tmp_path / "claims", "grpo", 0, 1, EVALS)
    _write(tmp_path / "rerun", "grpo", 0, 1, [(0, 0.6), (20, 0.9), (40, 0.9), (60, 0.9)])
    cells = cells_of(Regime("t", "online", 0, sources=(("grpo", ("claims", "rerun")),)), tmp_path)
    assert cells["grpo"][0]["evals"] == [list(e) for e in EVALS] and cells["grpo"][1]["evals"][1] == [20, 0.9]


def test_the_reread_compares_every_loss_with_grpo_of_its_regime_under_holm(tmp_path):
    # 60 steps: primary = mean of steps 20, 40, 60. grpo 0.70, 0.72, 0.74 by seed; gepo 0.60, 0.62, 0.64:
    # -10 points, equal SDs, Welch df 4, se sqrt(2 * 0.0004 / 3); pg one seed: no comparison
    for seed, shift in enumerate((0.0, 0.02, 0.04)):
        _write(tmp_path / "g", "grpo", 64, seed, [(0, 0.6)] + [(s, 0.70 + shift) for s in (20, 40, 60)])
        _write(tmp_path / "g", "gepo", 64, seed, [(0, 0.6)] + [(s, 0.60 + shift) for s in (20, 40, 60)])
    _write(tmp_path / "g", "pg", 64, 0, EVALS)
    rows = compare(collect([Regime("A", "D 64", 64, "g")], tmp_path))
    assert [r.cell.label for r in rows] == ["gepo"]
    d = rows[0].primary
    assert d.mean == pytest.approx(-0.10) and d.df == pytest.approx(4.0)
    assert d.half == pytest.approx(2.776445 * math.sqrt(2 * 0.0004 / 3), abs=1e-6)
    assert rows[0].holm_p == pytest.approx(d.p) and rows[0].verdict == "worse"  # a family of one


def test_the_screen_picks_the_highest_mean_only_once_every_candidate_has_its_seeds():
    from examples.paper_delay.screen import pick

    cells = {"a": {0: 0.70, 1: 0.60}, "b": {0: 0.66, 1: 0.66}}  # means 0.65 and 0.66
    assert pick(cells, seeds=(0, 1)) == "b"
    assert pick({**cells, "c": {0: 0.9}}, seeds=(0, 1)) is None  # c lacks seed 1: no pick yet


# seeds mod 3 give each seed's primary 0, 1 or 2 points above its cell's base. Confirmation, seeds 100-112: four
# 0s, five 1s, four 2s -> variance 8 / 12 points^2; Welch, equal cells: se = sqrt(2 x 8 / 12 / 13) = 0.320, t(24)
# 2.064, half 0.66. Replication, seeds 200-206: 2, 0, 1, 2, 0, 1, 2 -> mean 8 / 7, variance (14 - 7 (8 / 7)^2) / 6
# = 34 / 42; se = sqrt(2 x 34 / 42 / 7) = 0.481, t(12) 2.179, half 1.05. Each cell's own interval: confirmation
# 71.0 (GRPO at lag 32) ± t(12) sqrt(8 / 12 / 13) = 2.179 x 0.226 = 0.49; replication 70 + 8 / 7 = 71.1 ±
# t(6) sqrt(34 / 42 / 7) = 2.447 x 0.340 = 0.83. The SD rule pools the first sd_after
# seeds: confirmation 100-109 (1, 2, 0 three times, then 1: mean 1, variance 6 / 9); replication 200-204 (2, 0, 1, 2, 0:
# mean 1, variance 4 / 4).
@pytest.mark.parametrize("name, sd_variance, row", [
    ("CONFIRMATION", 6 / 9, "| lag 32 | 71.0 ± 0.5 | 76.0 ± 0.5 | +5.0 ± 0.7 |"),
    ("REPLICATION", 4 / 4, "| lag 32 | 71.1 ± 0.8 | 76.1 ± 0.8 | +5.0 ± 1.0 |")])
def test_a_study_doubles_t_on_a_late_gain_of_3_points_and_says_who_wins(tmp_path, name, sd_variance, row):
    from examples.paper_delay import confirm

    study = getattr(confirm, name)
    folder = tmp_path / study.folder
    steps = list(range(60, 301, 20))
    assert confirm.runs_folder(study, tmp_path)[1:] == (None, study.folder)  # no runs: the length waits
    # GRPO online, the study's first five seeds: 0.2 points a step over steps 200-300 -> late gain 0.0002 x 100 = 2 points
    for seed in study.first:
        _write(folder, "grpo", 0, seed, [(s, 0.6 + 0.0002 * s) for s in steps], lag=True, steps=300)
    assert "T = 300 stands" in confirm.run_length(load(folder), study)
    assert confirm.runs_folder(study, tmp_path)[1:] == (300, study.folder)
    for seed in study.first:  # 0.4 a step: 4 points, past the rule
        _write(folder, "grpo", 0, seed, [(s, 0.6 + 0.0004 * s) for s in steps], lag=True, steps=300)
    assert "T doubles to 600" in confirm.run_length(load(folder), study)
    assert confirm.decided_t(load(folder), study) == 600
    assert confirm.runs_folder(study, tmp_path)[1:] == (600, study.doubled)  # the runs at T = 600: their own folder

    def cell(loss, lag, base, seeds):  # primary = base + 0, 1 or 2 points by seed (every evaluation alike)
        for seed in seeds:
            _write(folder, loss, lag, seed, [(s, base + 0.01 * (seed % 3)) for s in (140, 220, 300)], lag=True, steps=300)

    def grid(seeds):
        for lag in confirm.LAGS:
            cell("grpo", lag, 0.70, seeds)
            cell(confirm.PICK, lag, 0.75 if lag == 32 else 0.70, seeds)

    grid(study.seeds(study.sd_after - 1))
    cell("grpo", 0, 0.0, [study.first_seed - 1])  # a seed before the study's first: never read
    assert confirm.seeds_needed(load(folder), study) == (None, None)
    grid(study.seeds(study.sd_after))
    need, s = confirm.seeds_needed(load(folder), study)
    assert need == study.declared and s == pytest.approx(0.01 * math.sqrt(sd_variance))
    assert confirm.verdict(load(folder), need, study)[1] is None  # not yet: the cells lack seeds
    grid(study.seeds(study.declared))
    cell("grpo", 32, 0.99, [study.first_seed + study.declared])  # a seed past the ones needed: not read
    said, won = confirm.verdict(load(folder), need, study)
    assert row in said[0] and "wins**: superior at lag 32" in said[1] and won is True
    cell(confirm.PICK, 0, 0.66, study.seeds(need))  # 4 points below GRPO online: not non-inferior at 3
    said, won = confirm.verdict(load(folder), need, study)
    assert "does not win**: superior, but not non-inferior" in said[1] and won is False
    assert "in every regime: **no**" in said[1]  # what the shipped sampling's study decides by


def test_the_replications_seven_seeds_are_what_superiority_asks_at_the_planned_sd_of_1_5():
    from examples.paper_delay import confirm
    from examples.paper_delay.protocol import seeds_per_cell

    # at SD 1.5 points: non-inferiority (two-sided 0.05) asks 6 seeds, superiority at 0.025 asks 7; at 2.0: 9 and 10
    assert seeds_per_cell(0.015, 0.03, confirm.CONFIRMATION.sd_alpha) == 6
    assert seeds_per_cell(0.015, 0.03, confirm.REPLICATION.sd_alpha) == 7 == confirm.REPLICATION.declared
    assert seeds_per_cell(0.02, 0.03, confirm.REPLICATION.sd_alpha) == 10


def test_a_study_raises_its_seeds_when_its_measured_sd_asks_for_more(tmp_path):
    from examples.paper_delay import confirm
    from examples.paper_delay.protocol import seeds_per_cell

    study = confirm.REPLICATION
    folder = tmp_path / study.folder
    for loss in ("grpo", confirm.PICK):  # seeds 200-204 mod 3: 2, 0, 1, 2, 0 -> 3 points apart: SD 3 points
        for lag in confirm.LAGS:
            for seed in study.seeds(study.sd_after):
                _write(folder, loss, lag, seed, [(s, 0.7 + 0.03 * (seed % 3)) for s in (140, 220, 300)],
                       lag=True, steps=300)
    need, s = confirm.seeds_needed(load(folder), study)
    assert s == pytest.approx(0.03) and need == seeds_per_cell(0.03, 0.03, confirm.ALPHA / 2) > study.declared


def test_a_replication_reads_no_cell_unless_grpo_online_learns_6_points_above_the_start(tmp_path):
    from examples.paper_delay import confirm

    study = confirm.REPLICATION_ARITH
    assert study.sensitivity == 2 * confirm.MARGIN == pytest.approx(0.06)
    folder = tmp_path / study.folder
    steps = list(range(60, 301, 20))  # burn-in 60: the primary is the mean of all 13

    def online(level):  # GRPO online, the first five seeds, flat at `level` (no late gain: T = 300)
        for seed in study.first:
            _write(folder, "grpo", 0, seed, [(s, level) for s in steps], lag=True, steps=300, start=0.40)

    def grid():  # every cell's 7 seeds: the pick 5 points above GRPO at the lags
        for lag in confirm.LAGS:
            for loss, base in (("grpo", 0.50), (confirm.PICK, 0.55 if lag else 0.50)):
                for seed in study.seeds(study.declared):
                    if (loss, lag) != ("grpo", 0) or seed not in study.first:
                        _write(folder, loss, lag, seed, [(s, base + 0.01 * (seed % 3)) for s in steps], lag=True,
                               steps=300, start=0.40)

    assert confirm.sensitive(load(folder), study) == ("", None)  # waits for the cell
    online(0.459)  # 5.9 points above the start of 40
    grid()
    text, won = confirm.report(study, tmp_path)
    assert "+5.9, +5.9, +5.9, +5.9, +5.9, mean +5.9 points against the declared 6: **fails**" in text
    assert "Verdict: none (the gate failed)." in text and won is None
    online(0.461)  # 6.1: it holds, and the verdict is read
    text, won = confirm.report(study, tmp_path)
    assert "mean +6.1 points against the declared 6: **holds**." in text and won is True
    assert "in every regime: **yes**" in text
    assert confirm.sensitive(load(folder), confirm.CONFIRMATION)[1] is True  # the confirmation declared no gate
