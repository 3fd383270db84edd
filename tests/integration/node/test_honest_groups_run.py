"""examples/bench_honest_groups.py: one tiny run end to end (sample, audit, append, pool). The pooling
by hand: tests/unit/node/test_honest_groups.py."""

import json
import subprocess
import sys

from helpers.repo import ROOT


def test_a_run_appends_audited_groups_and_the_summary_pools_two_runs(tmp_path):
    out = tmp_path / "honest.jsonl"
    cmd = [sys.executable, str(ROOT / "examples/bench_honest_groups.py"), "run", "--shape", "mid", "--dtype",
           "bfloat16", "--batch", "8", "--tokens", "4", "--groups", "2", "--out", str(out)]
    for _ in range(2):
        subprocess.run(cmd, check=True, timeout=300, capture_output=True)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 * 2 and len({r["run"] for r in records}) == 2
    assert all(r["positions"] == 8 * 4 and 0 <= r["max_margin"] < 1 for r in records)  # honest: within the tolerance
    table = subprocess.run([sys.executable, str(ROOT / "examples/bench_honest_groups.py"), "summary", str(out)],
                           check=True, timeout=120, capture_output=True, text=True).stdout
    row = next(line for line in table.splitlines() if line.startswith("| mid"))
    assert "| HF bfloat16 batch 8 | CPU | 2 | 4 | 128 |" in row
