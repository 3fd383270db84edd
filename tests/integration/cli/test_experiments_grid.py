"""The science scripts (examples/paper_delay, examples/paper_share): a tiny real grid end to end
(resumable, tables with intervals, plots), a stopped grid leaves no worker behind, and the sharing
experiment runs to its table in the simulator and as a loopback swarm of real processes. Their
statistics and delay model by hand: tests/unit/cli/test_experiments.py."""

import json
import re
import subprocess
import sys

import pytest

from helpers.repo import ROOT


def test_a_tiny_grid_runs_resumes_and_reports_intervals(tmp_path):
    cmd = [sys.executable, str(ROOT / "examples/paper_delay/run.py"), "--task", "arith", "--losses", "gepo",
           "--delays", "0", "8", "--seeds", "0", "1", "--steps", "3", "--eval-every", "0", "--eval-size", "20",
           "--groups", "4", "--max-new-tokens", "6", "--workers", "2", "--out", str(tmp_path)]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "4 runs to do" in first.stdout
    summaries = [json.loads(p.read_text()) for p in tmp_path.glob("*.summary.json")]
    assert len(summaries) == 4
    for s in summaries:
        assert s["steps"] == 3 and (s["staleness"] == 0 if s["delay"] == 0 else 0 <= s["staleness"] <= 8)
    table = (tmp_path / "table.md").read_text()
    assert "| gepo | 8 | 2 |" in table and " ± " in table  # two seeds: a mean with its interval
    for png in ("eval_curves.png", "accuracy_vs_delay.png", "is_var_kl_vs_staleness.png"):
        assert (tmp_path / png).stat().st_size > 1000
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 0 and "0 runs to do" in again.stdout  # finished cells are not re-run
    other = subprocess.run([*cmd, "--lr", "1e-4"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert other.returncode != 0 and "was run with" in other.stderr  # a resumed grid never mixes settings


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_stopped_grid_leaves_no_worker_behind(tmp_path, sig):
    """A grid stopped mid-cell, politely or not, leaves none of its workers running (they would go
    on computing, and a resumed grid would run beside them)."""
    import os
    import signal
    import time

    from swarm.lifetime import children
    from tests.helpers.procs import alive, wait_gone

    cmd = [sys.executable, str(ROOT / "examples/paper_delay/run.py"), "--task", "arith", "--losses", "grpo",
           "--delays", "0", "--seeds", "0", "1", "--steps", "100000", "--eval-every", "0", "--eval-size", "20",
           "--groups", "2", "--max-new-tokens", "6", "--workers", "2", "--out", str(tmp_path)]
    grid = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kids: set[int] = set()
    try:
        deadline = time.monotonic() + 240
        while len(list(tmp_path.glob("*.jsonl"))) < 2:  # both workers are inside a cell
            assert time.monotonic() < deadline and grid.poll() is None, "the grid never started its cells"
            time.sleep(0.5)
        kids = set(children(grid.pid))
        assert len(kids) >= 2
        os.kill(grid.pid, getattr(signal, sig))
        grid.wait(timeout=30)
        left = wait_gone(kids, 20)
        assert not left, f"still running after the grid's {sig}: {left}"
        assert not list(tmp_path.glob("*.summary.json"))  # a cell cut short leaves no summary: it is re-run
    finally:
        for pid in {grid.pid} | alive(kids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_the_sharing_experiment_runs_to_its_table_simulated_and_real(tmp_path):
    """examples/paper_share at its smallest: the simulator's runs (alone and ftis) and one real
    loopback swarm of three learners and three samplers (ftis): each writes its summaries and a
    table with a row per learner (examples/paper_hetero is left out: it first trains two models)."""
    sim = subprocess.run([sys.executable, str(ROOT / "examples/paper_share/run.py"), "--seeds", "0", "--steps", "2",
                          "--eval-every", "1", "--eval-size", "10", "--settings", "alone", "ftis", "--workers", "1",
                          "--out", str(tmp_path / "sim")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert sim.returncode == 0, sim.stderr[-3000:]
    table = (tmp_path / "sim" / "table.md").read_text()
    for learner in ("arith", "arith-b", "arith-c"):
        for setting in ("alone", "ftis"):
            assert f"| {learner} | {setting} | 1 |" in table, table

    real = subprocess.run([sys.executable, str(ROOT / "examples/paper_share/real.py"), "--seeds", "0", "--settings", "ftis",
                           "--steps", "3", "--eval-every", "3", "--eval-size", "10", "--settle-s", "10",
                           "--timeout-s", "300", "--out", str(tmp_path / "real")],  # its own timeout first: it says why
                          capture_output=True, text=True, timeout=420, cwd=ROOT)
    assert real.returncode == 0, (real.stdout[-2000:], real.stderr[-3000:])
    assert (tmp_path / "real" / "ftis_s0.summary.json").exists()
    table = (tmp_path / "real" / "table.md").read_text()
    for learner in ("arith", "arith-b", "arith-c"):  # each trained on its partners' groups: F-TIS ran
        row = re.search(rf"(?m)^\| {learner} \| ftis \| 1 \|.*\| ([\d.]+) \|$", table)
        assert row and float(row.group(1)) > 0, table
