"""Plots of metrics JSONL files: eval accuracy and a training overview, several runs overlaid.

A RUN is a metrics `.jsonl` file, or a folder searched recursively for `metrics.jsonl` files (or,
if it has none, any `*.jsonl` holding metric records). A folder with one such file is one run
labelled with the folder's name; a folder with several (a sweep, e.g. examples/paper_delay's
output) gives one run per file, labelled by its path inside the folder: several learners' records
are never merged into one curve. A file's label is its name without ".jsonl" (its folder's name
for a file called metrics.jsonl).

The x axis is the learner version ("step" for records written before "version" was the common
key); when a file has several records of one version (a run resumed from a checkpoint appended to
the same file) the last one wins. Rendering uses matplotlib's Agg canvas directly, no pyplot, so
it needs no display and touches no global backend state.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from node.metrics import Kind, Metric, read_metrics, skipped_lines

log = logging.getLogger(__name__)

HOW_TO_FIX = "pass a metrics.jsonl or a run folder (hetero-node local/simulate/join write WORKDIR/metrics.jsonl)"

PANELS: tuple[tuple[str, str, str], ...] = (
    # (record key, panel title, y label); eval_acc comes from eval records, the rest from step records
    (Metric.REWARD, "Reward (train batch mean)", "reward"),
    (Metric.EVAL_ACC, "Eval accuracy", "accuracy"),
    (Metric.LOSS, "Loss", "loss"),
    (Metric.GRAD_NORM, "Gradient norm (before clipping)", "L2 norm"),
    (Metric.STALENESS_MEAN, "Staleness of own rollouts (mean)", "versions behind"),
    (Metric.IS_WEIGHT_VAR, "Importance-weight variance", "variance"),
    (Metric.KL_K3, "KL to sampling policy (k3)", "KL"),
    (Metric.CLIP_FRAC, "Clipped fraction", "fraction"),
    (Metric.WEIGHTS_BYTES_VS_VIEW, "Published version size (vs a full copy of the view)", "share of the view's bytes"),
)
KEYFRAMES_ON = "weights_bytes_vs_view"
"""The panel that marks keyframes (step records with weights_kind "keyframe"). Its ratio is to a
full copy of the view in the view's own dtype (float32 on a CPU learner, bfloat16 on GPUs).
Records written before weights_bytes_vs_view have only weights_bytes_vs_bf16, a ratio that reads
about 1.7 for a float32 keyframe; they get no panel rather than a mislabelled one."""
SMOOTH_MIN_POINTS = 20
"""Step series with at least this many points are drawn faint (raw) plus a moving average."""
X_LABEL = "learner version"


@dataclass
class Run:
    """One run's records, split by kind and keyed by version (last record of a version wins)."""

    label: str
    path: Path
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(versions, values) of `key`, sorted by version; non-finite values become NaN (a gap)."""
        source = self.evals if key == Metric.EVAL_ACC else self.steps
        xs, ys = [], []
        for version in sorted(source):
            value = source[version].get(key)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                xs.append(version)
                ys.append(float(value) if math.isfinite(value) else math.nan)
        return xs, ys

    def has(self, key: str) -> bool:
        return any(math.isfinite(y) for y in self.series(key)[1])


def _version(rec: dict[str, Any]) -> int | None:
    for key in (Metric.VERSION, Metric.STEP):
        value = rec.get(key)
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
            return int(value)
    return None


def load_run(path: Path, label: str) -> Run | None:
    """The run in one JSONL file, or None if it holds no step or eval records (not a metrics file:
    quietly, however many lines it has). A metrics file's damaged lines cost one warning."""
    run, skipped = Run(label, path), []
    for rec in read_metrics(path, skipped):
        version = _version(rec)
        kind = rec.get(Metric.KIND, Kind.STEP)
        if version is None or kind not in (Kind.STEP, Kind.EVAL):
            continue
        (run.evals if kind == Kind.EVAL else run.steps)[version] = rec
    if not (run.steps or run.evals):
        return None
    if skipped:
        log.warning("%s: %s", path, skipped_lines(skipped))
    return run


def _file_label(rel: Path, folder_name: str) -> str:
    """metrics.jsonl -> its folder's name; other files -> their path without the suffix."""
    if rel.name == "metrics.jsonl":
        return rel.parent.as_posix() if rel.parent != Path(".") else folder_name
    return rel.with_suffix("").as_posix()


def find_runs(paths: Sequence[str | Path]) -> list[Run]:
    """The runs at `paths` (files or folders; see the module doc), with unique labels.

    Raises FileNotFoundError, saying what was looked for, when a path does not exist or holds no
    metrics.
    """
    if not paths:
        raise FileNotFoundError(f"no runs given: {HOW_TO_FIX}")
    runs: list[Run] = []
    for given in map(Path, paths):
        if not given.exists():
            raise FileNotFoundError(f"{given} does not exist: {HOW_TO_FIX}")
        if given.is_file():
            label = given.parent.resolve().name if given.name == "metrics.jsonl" else given.stem
            run = load_run(given, label or given.stem)
            if run is None:
                raise FileNotFoundError(f"{given} is not a metrics file: no line of it is a JSON record with a "
                                        f"'version' key, as hetero-node local and join write one a step; {HOW_TO_FIX}")
            runs.append(run)
            continue
        name = given.resolve().name
        files = sorted(given.rglob("metrics.jsonl")) or sorted(given.rglob("*.jsonl"))
        found = [r for r in (load_run(f, _file_label(f.relative_to(given), name)) for f in files) if r is not None]
        if not found:
            looked = (f"{len(files)} .jsonl file(s) without step or eval records" if files
                      else "no metrics.jsonl or *.jsonl")
            raise FileNotFoundError(f"no metrics in {given} (searched recursively, found {looked}): {HOW_TO_FIX}")
        if len(found) == 1:
            found[0].label = name
        runs.extend(found)
    _dedupe_labels(runs)
    return runs


def _dedupe_labels(runs: list[Run]) -> None:
    """Same label twice (e.g. `seed0/run/metrics.jsonl` and `seed1/run/metrics.jsonl`): use each
    path below the clashing runs' common folder ("seed0/run"), then number what still clashes."""
    for attempt in range(2):
        groups: dict[str, list[Run]] = {}
        for run in runs:
            groups.setdefault(run.label, []).append(run)
        clashes = [group for group in groups.values() if len(group) > 1]
        if not clashes:
            return
        for group in clashes:
            if attempt == 0:
                named = [r.path.resolve().parent if r.path.name == "metrics.jsonl" else r.path.resolve().with_suffix("")
                         for r in group]
                common = Path(os.path.commonpath(named))
                for run, p in zip(group, named):
                    run.label = p.relative_to(common).as_posix() if p != common else p.name
            else:
                for i, run in enumerate(group):
                    run.label = f"{run.label} ({i + 1})"


def moving_average(ys: Sequence[float], window: int):
    """Centred moving average that ignores NaN and shrinks at the ends (no lag, no edge droop)."""
    import numpy as np

    y = np.asarray(ys, dtype=float)
    ok = np.isfinite(y)
    kernel = np.ones(window)
    total = np.convolve(np.where(ok, y, 0.0), kernel, mode="same")
    count = np.convolve(ok.astype(float), kernel, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def _window(n: int) -> int:
    return max(1, min(200, n // 20))


def _colors(n: int) -> list:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _draw(ax, run: Run, key: str, color) -> None:
    xs, ys = run.series(key)
    if not xs:
        return
    if key == Metric.EVAL_ACC:
        ax.plot(xs, ys, color=color, lw=1.6, marker="o" if len(xs) <= 60 else None, ms=3.5, label=run.label)
    elif len(xs) >= SMOOTH_MIN_POINTS:
        ax.plot(xs, ys, color=color, lw=0.7, alpha=0.25)
        ax.plot(xs, moving_average(ys, _window(len(xs))), color=color, lw=1.6, label=run.label)
    else:
        ax.plot(xs, ys, color=color, lw=1.4, marker="o", ms=3, label=run.label)


def _style(ax, title: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(True, alpha=0.3)


def _plot_eval(runs: list[Run], colors: list, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.8) if len(runs) <= 8 else (10.5, 4.8), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for run, color in zip(runs, colors):
        _draw(ax, run, Metric.EVAL_ACC, color)
    _style(ax, "Eval accuracy", "accuracy (share of held-out problems solved)")
    ax.set_xlabel(X_LABEL, fontsize=9)
    if len(runs) <= 8:
        ax.legend(fontsize=8, loc="best", framealpha=0.85)
    else:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.savefig(path)


def _mark_keyframes(ax, run: Run, key: str, color) -> bool:
    """Hollow triangles on the versions published as keyframes; whether there were any."""
    points = dict(zip(*run.series(key)))
    xs = [v for v in points if run.steps[v].get(Metric.WEIGHTS_KIND) == "keyframe"]
    if xs:
        ax.plot(xs, [points[v] for v in xs], ls="none", marker="^", ms=5, mfc="none", mec=color, mew=1.2)
    return bool(xs)


def overview_figure(runs: list[Run]):
    """The training overview (a matplotlib Figure): one panel per metric of PANELS that some run
    has, keyframes marked on the version-size panel; None if no run has any of them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    keys = [panel for panel in PANELS if any(run.has(panel[0]) for run in runs)]
    if not keys:
        return None
    colors = _colors(len(runs))
    n = len(keys)
    ncols = 2 if n <= 4 else 3 if n in (5, 6, 9) else 4
    nrows = math.ceil(n / ncols)
    legend_rows = math.ceil(len(runs) / 4)
    fig = Figure(figsize=(4.3 * ncols, 3.1 * nrows + 0.6 + 0.25 * legend_rows), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    xmin = min(x for run in runs for key, _, _ in keys for x in run.series(key)[0][:1])
    xmax = max(x for run in runs for key, _, _ in keys for x in run.series(key)[0][-1:])
    for i, (ax, (key, title, ylabel)) in enumerate(zip(axes, keys)):
        marked = False
        for run, color in zip(runs, colors):
            _draw(ax, run, key, color)
            if key == KEYFRAMES_ON:
                marked = _mark_keyframes(ax, run, key, color) or marked
        _style(ax, title, ylabel)
        if marked:
            ax.legend([Line2D([], [], ls="none", marker="^", mfc="none", mec="0.3")], ["keyframe"], fontsize=8,
                      loc="best", framealpha=0.85)
        if xmax > xmin:
            ax.set_xlim(xmin, xmax)
        if i + ncols >= n:  # nothing below it: the lowest panel of its column
            ax.set_xlabel(X_LABEL, fontsize=9)
    for ax in axes[n:]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=c, lw=2) for c in colors]
    fig.legend(handles, [r.label for r in runs], loc="outside lower center", ncols=min(len(runs), 4),
               fontsize=9, frameon=False)
    smoothed = any(len(run.series(key)[0]) >= SMOOTH_MIN_POINTS
                   for run in runs for key, _, _ in keys if key != Metric.EVAL_ACC)
    fig.suptitle("Training overview" + ("  (faint: per-step value, solid: moving average)" if smoothed else ""),
                 fontsize=12)
    return fig


def plot_runs(runs: list[Path], out_dir: Path) -> list[Path]:
    """Write `eval_acc.png` and `overview.png` for `runs` into `out_dir`; return the paths written.

    eval_acc.png: eval accuracy vs version, all runs overlaid (skipped when no run has eval
    records). overview.png: one panel per metric in PANELS that some run has (reward, eval_acc,
    loss, grad_norm, staleness_mean, is_weight_var, kl_k3, clip_frac, weights_bytes_vs_view with
    keyframes marked), long step series drawn raw and faint with a centred moving average on top.
    Raises FileNotFoundError when a run path does not exist or holds no metrics (see `find_runs`).
    """
    loaded = find_runs(runs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = _colors(len(loaded))
    written: list[Path] = []
    if any(run.has(Metric.EVAL_ACC) for run in loaded):
        path = out_dir / "eval_acc.png"
        _plot_eval(loaded, colors, path)
        written.append(path)
    overview = overview_figure(loaded)
    if overview is not None:
        path = out_dir / "overview.png"
        overview.savefig(path)
        written.append(path)
    if not written:
        # records exist, but none of the plotted metrics (e.g. only counters)
        raise FileNotFoundError(f"no plottable metrics ({', '.join(k for k, _, _ in PANELS)}) in "
                                f"{', '.join(map(str, runs))}: {HOW_TO_FIX}")
    log.debug("plotted %d run(s): %s", len(loaded), ", ".join(r.label for r in loaded))
    return written
