"""examples/paper_delay/mechanism.py: the mechanism's diagnostics per cell, from the burn-in on (hand-computed)."""

import json
import math

import pytest

from examples.paper_delay.mechanism import read_folder, run_figures, table, unit


def _step(version, clip, k3, grad=1.0, drift=0.1):
    return {"kind": "step", "version": version, "clip_frac": clip, "drift_frac": drift, "kl_k3": k3,
            "weight_mean_pos": 1.0, "weight_mean_neg": 1.0, "grad_norm": grad, "reward": 0.5}


def _write(folder, loss, delay, seed, records, steps=60, lag=True, summary=True):
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{loss}_d{delay}_s{seed}"
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if summary:
        s = {"loss": loss, "delay": delay, "seed": seed, "steps": steps, "settings": {"steps": steps, "lag": lag}}
        (folder / f"{name}.summary.json").write_text(json.dumps(s))


def test_a_run_is_read_from_its_burn_in_with_means_and_medians():
    # 60 steps at lag 32: burn-in max(12, 32) = 32, so version 31 (clip 0.9, k3 100) is not read
    records = [_step(31, 0.9, 100.0), _step(32, 0.1, 1.0, grad=2.0, drift=0.0), _step(40, 0.2, 2.0, grad=4.0, drift=0.0),
               _step(50, 0.3, 30.0, grad=9.0, drift=0.3), {"kind": "eval", "version": 40, "eval_acc": 0.7}]
    f = run_figures(records, 32)
    assert f["clip_frac"] == pytest.approx(0.2)  # (0.1 + 0.2 + 0.3) / 3
    assert f["drift_frac"] == pytest.approx(0.1)  # a mean (0 + 0 + 0.3) / 3, where the median is 0
    assert f["kl_k3"] == 2.0 and f["grad_norm"] == 4.0  # medians: the 30 and the 9 do not move them
    # from 12 on, version 31 counts and the mean moves
    assert run_figures(records, 12)["clip_frac"] == pytest.approx(1.5 / 4)
    # the figure from the own-model route when the step has none of its own (a loss's own diagnostic)
    routed = [{"kind": "step", "version": 40, "routes": {"own": {"clip_frac": 0.25}}}]
    assert run_figures(routed, 32)["clip_frac"] == 0.25 and math.isnan(run_figures(routed, 32)["kl_k3"])


def test_a_cell_is_its_seeds_mean_and_sd_from_its_runs_burn_in_and_an_unfinished_run_is_not_read(tmp_path):
    # 60 steps at lag 32: burn-in 32, so seed 1's version 20 (clip 0.9) is not read; without the lag it would be (12)
    _write(tmp_path, "grpo", 32, 0, [_step(40, 0.01, 0.1)])
    _write(tmp_path, "grpo", 32, 1, [_step(20, 0.9, 0.1), _step(40, 0.03, 0.1)])
    _write(tmp_path, "grpo", 32, 2, [_step(40, 0.9, 0.1)], summary=False)  # still running
    _write(tmp_path, "gepo-lenclip", 32, 0, [_step(40, 0.25, 0.1)])
    _write(tmp_path, "grpo", 64, 0, [_step(50, 0.5, 0.1)], lag=False)  # a log-normal delay's maximum, burn-in 12
    cells = {(c.loss, c.delay): c for c in read_folder(tmp_path)}
    assert sorted(cells[("grpo", 32)].runs) == [0, 1]
    rows = table(list(cells.values())).splitlines()
    # clipped %: mean 2.00, SD sqrt(((1 - 2)^2 + (3 - 2)^2) / 1) = 1.41; one seed: no SD; by delay, then loss
    assert rows[2].startswith("| lag 32 | gepo-lenclip | 1 | sequences | 25.00 |")
    assert rows[3].startswith("| lag 32 | grpo | 2 | tokens | 2.00 ± 1.41 |")
    assert rows[4].startswith("| max delay 64 | grpo | 1 | tokens | 50.00 |")


def test_the_clips_unit_is_the_losss():
    assert unit("grpo") == "tokens" and unit("grpo_seqmask") == "tokens"
    assert unit("gepo-lenclip") == "sequences" and unit("gspo") == "sequences" and unit("gepo") == "sequences"
