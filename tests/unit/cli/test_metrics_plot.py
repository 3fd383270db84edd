"""MetricsWriter (JSONL + TensorBoard), read_metrics and `plot_runs`: fast, no training."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from cli.plot import plot_runs
from node.metrics import MetricsWriter, read_metrics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def step_rec(version: int, loss: float = 0.5, **kw) -> dict:
    """A step record shaped like the learner's (values exact in float32, so TensorBoard compares ==)."""
    rec = {"kind": "step", "version": version, "time_s": 0.25 * version, "reward": 0.125 * version,
           "loss": loss, "grad_norm": 1.5, "staleness_mean": 2.0, "is_weight_var": 0.0625, "kl_k3": 0.015625,
           "clip_frac": 0.25, "step_skipped": 0.0, "buffered": 3,
           "drops": {"stale": version, "duplicate": 1},
           "staleness_hist": {"0": 5, "2": 3},
           "accepted_by_sampler": {"12D3KooWpeerA": 4 * version},
           "routes": {"stale": {"loss": 0.5 * version, "is_weight_mean": 1.0, "sequences": 12},
                      "foreign": {"loss": -0.25, "sequences": 4}}}
    rec.update(kw)
    return rec


def eval_rec(version: int, acc: float) -> dict:
    return {"kind": "eval", "version": version, "time_s": 1.0 * version, "eval_acc": acc}


def load_events(tb_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def scalars(acc, tag) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_jsonl_and_tensorboard_scalars(tmp_path):
    jsonl, tb = tmp_path / "run" / "deep" / "metrics.jsonl", tmp_path / "tb"  # parent folders created
    with MetricsWriter(jsonl, tb) as w:
        w.write(step_rec(1))
        w.write(step_rec(2, loss=float("nan"), grad_norm=float("inf"), step_skipped=1.0))
        w.write(eval_rec(2, 0.375))
        w.write(step_rec(3, loss=0.75))
        assert len(jsonl.read_text().splitlines()) == 4  # flushed per record, before close

    recs = read_metrics(jsonl)
    assert [r["kind"] for r in recs] == ["step", "step", "eval", "step"]
    assert math.isnan(recs[1]["loss"]) and recs[1]["grad_norm"] == math.inf  # JSONL keeps non-finite values
    assert recs[0]["routes"]["stale"]["sequences"] == 12

    acc = load_events(tb)
    tags = set(acc.Tags()["scalars"])
    assert scalars(acc, "train/routes/stale/loss") == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert scalars(acc, "train/routes/foreign/loss") == [(1, -0.25), (2, -0.25), (3, -0.25)]
    assert scalars(acc, "train/drops/stale") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert scalars(acc, "eval/eval_acc") == [(2, 0.375)]
    assert scalars(acc, "train/loss") == [(1, 0.5), (3, 0.75)]  # the NaN at version 2 is skipped
    assert scalars(acc, "train/grad_norm") == [(1, 1.5), (3, 1.5)]  # so is the inf
    assert scalars(acc, "train/step_skipped") == [(1, 0.0), (2, 1.0), (3, 0.0)]
    assert scalars(acc, "train/reward") == [(1, 0.125), (2, 0.25), (3, 0.375)]
    # identifiers are not scalars; per-peer counts stay in the JSONL only; eval time_s is not duplicated
    assert not {"train/version", "train/kind", "eval/version", "eval/time_s"} & tags
    assert not any("accepted_by_sampler" in t for t in tags)
    assert not any(t.startswith("train/staleness_hist") for t in tags)
    # the staleness histogram is one TensorBoard histogram with one bucket per staleness value
    hist = acc.Histograms("train/staleness_hist")
    assert [h.step for h in hist] == [1, 2, 3]
    h = hist[0].histogram_value
    assert (h.min, h.max, h.num) == (0, 2, 8)
    assert list(h.bucket) == [5, 0, 3]


def test_jsonl_only_without_tensorboard(tmp_path):
    jsonl = tmp_path / "m.jsonl"
    w = MetricsWriter(jsonl)
    w.write(step_rec(1))
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write(step_rec(2))
    assert [r["version"] for r in read_metrics(jsonl)] == [1]
    with MetricsWriter(jsonl) as w:  # appends
        w.write(eval_rec(1, 0.5))
    assert [r["kind"] for r in read_metrics(jsonl)] == ["step", "eval"]


def test_read_metrics_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(step_rec(v)) for v in (1, 2)]
    path.write_text("\n".join(lines) + "\n" + lines[0][:37])  # the writer died mid-line
    assert [r["version"] for r in read_metrics(path)] == [1, 2]
    path.write_text("\n".join(lines) + "\n\n")  # trailing blank lines are fine too
    assert [r["version"] for r in read_metrics(path)] == [1, 2]
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path / "missing.jsonl")


def synthetic_run(path, seed: int, steps: int = 120, eval_every: int = 20, slope: float = 0.004) -> None:
    rng = random.Random(seed)
    with MetricsWriter(path) as w:
        w.write(eval_rec(0, 0.05))
        for v in range(1, steps + 1):
            w.write(step_rec(v, loss=rng.gauss(0, 0.1), reward=min(1.0, slope * v + rng.random() * 0.3),
                             grad_norm=abs(rng.gauss(1, 0.3)), staleness_mean=rng.uniform(0, 6),
                             is_weight_var=rng.uniform(0, 0.2), kl_k3=rng.uniform(0, 0.01),
                             clip_frac=rng.uniform(0, 0.1)))
            if v % eval_every == 0:
                w.write(eval_rec(v, min(1.0, 0.05 + slope * v + rng.uniform(-0.02, 0.02))))


def assert_real_png(path) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert 10_000 < len(data) < 5_000_000
    img = matplotlib.image.imread(str(path))
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
    pixels = img[..., :3].reshape(-1, 3)
    assert pixels.std(axis=0).max() > 0.05  # not blank
    rgb = (pixels * 255).astype(np.uint32)
    assert np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2]).size > 20  # lines, text and several colours


def test_plot_runs_writes_real_pngs(tmp_path):
    synthetic_run(tmp_path / "gepo" / "metrics.jsonl", seed=0)  # a run folder
    synthetic_run(tmp_path / "grpo.jsonl", seed=1, slope=0.002)  # a metrics file
    out = tmp_path / "plots"
    paths = plot_runs([tmp_path / "gepo", tmp_path / "grpo.jsonl"], out)
    assert paths == [out / "eval_acc.png", out / "overview.png"]
    for p in paths:
        assert_real_png(p)


def test_plot_runs_folder_of_several_runs_and_step_only(tmp_path):
    sweep = tmp_path / "sweep"
    for i, name in enumerate(("a", "b")):
        synthetic_run(sweep / f"{name}.jsonl", seed=i, steps=10, eval_every=100)  # only the version-0 eval
    (sweep / "notes.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')  # not metrics: ignored
    paths = plot_runs([sweep], tmp_path / "out")
    assert [p.name for p in paths] == ["eval_acc.png", "overview.png"]
    assert_real_png(paths[1])


@pytest.mark.parametrize("make", ["missing", "empty_folder", "not_metrics"])
def test_missing_or_empty_run_says_how_to_fix(tmp_path, make):
    target = tmp_path / "run"
    if make == "empty_folder":
        target.mkdir()
        (target / "log.txt").write_text("hello\n")
    elif make == "not_metrics":
        target = tmp_path / "data.jsonl"
        target.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(FileNotFoundError) as e:
        plot_runs([target], tmp_path / "out")
    msg = str(e.value)
    assert str(target) in msg
    assert "pass a metrics.jsonl or a run folder" in msg and "WORKDIR/metrics.jsonl" in msg
    assert not (tmp_path / "out").exists()  # nothing written on failure


def test_run_labels_are_names_and_unique(tmp_path):
    from cli.plot import find_runs

    for rel in ("seed0/run/metrics.jsonl", "seed1/run/metrics.jsonl", "gepo/metrics.jsonl"):
        with MetricsWriter(tmp_path / rel) as w:
            w.write(step_rec(1))
    legacy = tmp_path / "local.jsonl"  # records keyed by "step" (older node/local.py) still plot
    legacy.write_text(json.dumps({"kind": "step", "step": 4, "reward": 0.5}) + "\n")
    runs = find_runs([tmp_path / "seed0/run/metrics.jsonl", tmp_path / "seed1/run", tmp_path / "gepo", legacy])
    assert [r.label for r in runs] == ["seed0/run", "seed1/run", "gepo", "local"]
    assert runs[3].series("reward") == ([4], [0.5])


def test_the_overview_plots_version_size_against_the_views_own_copy_and_marks_keyframes(tmp_path):
    """A float32-view run as the CPU demo writes it: keyframes 0.86 of a float32 copy (1.71 of a
    bfloat16 one) every 5 versions, patches of 0.55. The panel plots the ratio to the view's copy,
    says so, and marks the keyframes; a run that only has the bf16 ratio gets no such panel."""
    from cli.plot import find_runs, overview_figure

    path = tmp_path / "demo" / "metrics.jsonl"
    kinds = {v: "keyframe" if v % 5 == 0 else "patch" for v in range(12)}
    vs_view = {v: 0.859375 if kind == "keyframe" else 0.546875 for v, kind in kinds.items()}
    with MetricsWriter(path) as w:
        for v, kind in kinds.items():
            w.write(step_rec(v, weights_kind=kind, weights_keyframe=kind == "keyframe",
                             weights_bytes_vs_view=vs_view[v], weights_bytes_vs_bf16=2 * vs_view[v]))
    fig = overview_figure(find_runs([path]))
    [ax] = [ax for ax in fig.axes if ax.get_title().startswith("Published version size")]
    assert "view" in ax.get_title() and "bf16" not in ax.get_title(), ax.get_title()
    drawn = [(list(line.get_xdata()), list(line.get_ydata()), line.get_marker()) for line in ax.get_lines()]
    assert (list(vs_view), list(vs_view.values()), "o") in drawn, drawn
    assert ([0, 5, 10], [vs_view[0]] * 3, "^") in drawn, drawn  # the keyframes, marked
    assert not any(y == 2 * vs_view[x] for xs, ys, _ in drawn for x, y in zip(xs, ys)), drawn
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["keyframe"]

    old = tmp_path / "old.jsonl"  # written before weights_bytes_vs_view: no view dtype to compare with
    with MetricsWriter(old) as w:
        for v in range(3):
            w.write(step_rec(v, weights_bytes_vs_bf16=1.7, weights_keyframe=True))
    titles = [ax.get_title() for ax in overview_figure(find_runs([old])).axes]
    assert "Reward (train batch mean)" in titles and not any("version size" in t for t in titles), titles
