"""Issue 61's protocol (docs/RESULTS.md, "Protocol"): the statistics a stale-rollout grid is read with,
declared before its runs. Pure functions over the summaries run.py writes (`evals`: the run's
[(learner step, greedy eval accuracy)], step 0 the untrained start).

* **Primary metric** of a run: its mean eval accuracy over the evaluations at or after the burn-in
  (`burn_in`: the first fifth of the run, and under a pinned lag at least the lag, the steps in
  which staleness ramps up to it). **Secondary**: the mean of its last 3 evaluations.
* **Test**: Welch's unpaired t on the per-seed metrics of two cells (`welch`), 95% interval. Not
  paired: over the 87 comparisons of the existing grids with GRPO, var(a - b) / (var a + var b)
  is 0.96 on the primary metric (`pairing_ratio`; issue 61: 0.98 over 116 pairs on the last
  evaluation), so pairing removes almost no variance and halves the degrees of freedom; and Welch
  compares cells whose seeds differ, or whose variances do (a collapsing loss's is several times).
* **Correction**: Holm over the planned family of superiority tests (`holm`); non-inferiority
  against a margin (`non_inferior`) is asked in every other regime at once, an intersection-union
  test, which needs no correction.
* **Power**: seeds per cell for a two-sided Welch test of equal cells at the measured SD
  (`seeds_per_cell`), the t-quantile form of the normal formula n = 2 s^2 (z_a + z_b)^2 / d^2:
  within a seed of the exact noncentral-t answer (17 at d = 1 SD, 6 at 2 SD, 37 at 1 SD and
  alpha 0.05/48, as scipy's noncentral t gives).

Student t here is exact for any real df (the regularized incomplete beta), stdlib only, so the
verdicts do not depend on scipy being installed; run.py's `t975` table stays for its 95% tables.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

BURN_IN_SHARE = 0.2
"""The share of a run's steps whose evaluations the primary metric leaves out."""
LAST = 3
"""Evaluations the secondary metric (final accuracy) averages."""

Curve = Sequence[tuple[int, float]]
"""A run's evaluations: (learner step, accuracy), in step order."""


# ---- one run ------------------------------------------------------------------------------------

def burn_in(steps: int, lag: int = 0) -> int:
    """The first step whose evaluation the primary metric counts: a fifth of the run, and under a
    pinned lag (run.py --lag) at least the lag, before which staleness has not reached it."""
    return max(math.ceil(BURN_IN_SHARE * steps), lag)


def primary(evals: Curve, start: int) -> float:
    """Mean accuracy over the evaluations at step `start` or later."""
    kept = [acc for step, acc in evals if step >= start]
    if not kept:
        raise ValueError(f"no evaluation at or after step {start}: the run is shorter than its burn-in")
    return statistics.fmean(kept)


def secondary(evals: Curve, last: int = LAST) -> float:
    """Final accuracy: the mean of the last `last` evaluations (one evaluation is too noisy)."""
    if len(evals) < last:
        raise ValueError(f"{len(evals)} evaluations, the secondary metric needs {last}")
    return statistics.fmean(acc for _, acc in evals[-last:])


def late_gain(curve: Curve, share: float = 1 / 3) -> float:
    """What a curve still gains over its last `share` of steps: the least-squares slope of the
    evaluations there times that span. "Levelled" (RESULTS, Protocol) is a small late gain."""
    end = curve[-1][0]
    pts = [(s, a) for s, a in curve if s >= end - share * end]
    if len(pts) < 2:
        raise ValueError("a slope needs two evaluations in the last part of the run")
    xm, ym = statistics.fmean(s for s, _ in pts), statistics.fmean(a for _, a in pts)
    slope = sum((s - xm) * (a - ym) for s, a in pts) / sum((s - xm) ** 2 for s, _ in pts)
    return slope * share * end


# ---- Student t, stdlib only ---------------------------------------------------------------------

def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b), x in [0, 1]."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` (> 0, any real) degrees of freedom."""
    tail = 0.5 * _beta_regularized(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with t_cdf(t, df) = p, by bisection (p in (0, 1))."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p = {p} is not in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ---- two cells ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Difference:
    """mean(a) - mean(b) with its two-sided interval at `level` and p-value (H0: no difference)."""
    mean: float
    half: float
    df: float
    p: float
    level: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def _difference(mean: float, se: float, df: float, level: float) -> Difference:
    if se == 0.0:
        return Difference(mean, 0.0, df, 1.0 if mean == 0 else 0.0, level)
    p = 2.0 * (1.0 - t_cdf(abs(mean) / se, df))
    return Difference(mean, t_quantile(0.5 + level / 2.0, df) * se, df, p, level)


def welch(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Difference:
    """The protocol's test: Welch's unpaired t (unequal variances; Welch-Satterthwaite df)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a difference needs 2+ seeds a cell (got {len(a)} and {len(b)})")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0.0:
        return _difference(statistics.fmean(a) - statistics.fmean(b), 0.0, len(a) + len(b) - 2.0, level)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return _difference(statistics.fmean(a) - statistics.fmean(b), math.sqrt(va + vb), df, level)


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Difference:
    """Seed-by-seed differences (a[i] with b[i]), for the record: RESULTS' older readings."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    if len(diffs) < 2:
        raise ValueError("a paired difference needs 2+ pairs")
    se = statistics.stdev(diffs) / math.sqrt(len(diffs))
    return _difference(statistics.fmean(diffs), se, len(diffs) - 1.0, level)


def pairing_ratio(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float:
    """Sum of var(a - b) over sum of (var a + var b), over comparisons seeded alike (a[i] and b[i]
    share seed i): 1 when seeds share nothing, below 1 as far as pairing removes variance."""
    num = den = 0.0
    for a, b in pairs:
        num += statistics.variance([x - y for x, y in zip(a, b, strict=True)])
        den += statistics.variance(a) + statistics.variance(b)
    return num / den


def non_inferior(d: Difference, margin: float) -> bool:
    """Candidate - reference is non-inferior when its 95% interval's lower end lies above -margin
    (a one-sided test at 2.5%)."""
    return d.low > -margin


# ---- power and the family -----------------------------------------------------------------------

def detectable(se: float, df: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference a two-sided test at `alpha` finds with `power`, for a difference
    whose standard error is `se` (the t form of (z_{1-a/2} + z_power) * se)."""
    return (t_quantile(1.0 - alpha / 2.0, df) + t_quantile(power, df)) * se


def power_of(delta: float, se: float, df: float, alpha: float = 0.05) -> float:
    """The power of a test at `alpha` (two-sided; 2x the one-sided level of a non-inferiority
    test) to find a true difference `delta`: the inverse of `detectable`, the far tail left out."""
    return t_cdf(delta / se - t_quantile(1.0 - alpha / 2.0, df), df)


def seeds_per_cell(sd: float, delta: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Seeds in each of two cells of between-seed SD `sd` for a two-sided Welch test at `alpha` to
    find a true difference `delta` with `power` (se = sd sqrt(2 / n), df = 2n - 2)."""
    for n in range(2, 100_000):
        if detectable(sd * math.sqrt(2.0 / n), 2.0 * n - 2.0, alpha, power) <= delta:
            return n
    raise ValueError(f"more than 100,000 seeds for {delta} at SD {sd}")


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input's order: reject H_i at familywise alpha where the
    adjusted p_i <= alpha. Sorted ascending, p_(j) is scaled by (m - j + 1), then made monotone."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def sd(xs: Sequence[float]) -> float:
    """Between-seed standard deviation of a cell (nan below two seeds)."""
    return statistics.stdev(xs) if len(xs) >= 2 else math.nan


def pooled_sd(cells: Sequence[Sequence[float]]) -> float:
    """The SD pooled over cells: the square root of their variances' df-weighted mean."""
    used = [c for c in cells if len(c) >= 2]
    dof = sum(len(c) - 1 for c in used)
    return math.sqrt(sum((len(c) - 1) * statistics.variance(c) for c in used) / dof)
