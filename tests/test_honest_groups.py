"""examples/bench_honest_groups.py: honest groups pooled over runs per setting, by hand, and one
tiny run end to end (sample, audit, append, pool)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from examples.bench_honest_groups import SETTING_KEYS, pooled

ROOT = Path(__file__).resolve().parents[1]
SETTING = dict(shape="big", layers=28, weights="abc", dtype="bfloat16", batch=128, tokens=128, temperature=1.0,
               top_k=0, top_p=1.0, device="NVIDIA H100")


def _group(run: str, max_margin: float, flips: int = 1, positions: int = 1024, **other) -> dict:
    return dict(SETTING, **other, run=run, torch="2.11", positions=positions, max_margin=max_margin, flips=flips)


def test_groups_pool_over_runs_of_one_setting_and_never_across_settings():
    records = [_group("r1", 0.2), _group("r1", 1.5, flips=3), _group("r2", 0.4),  # one past margin 1
               _group("r2", 0.9, device="NVIDIA A100"),  # another GPU's kernels
               _group("r3", 0.1, weights="def")]  # other random weights: another model
    rows = {(r["device"], r["weights"]): r for r in pooled(records, margin=1.0)}
    assert len(rows) == 3
    h100 = rows[("NVIDIA H100", "abc")]
    assert (h100["runs"], h100["groups"], h100["positions"], h100["flips"], h100["failed"]) == (2, 3, 3072, 5, 1)
    assert h100["max_margin"] == 1.5
    # Wilson 95% for 1 of 3: (p + z^2/2n) / (1 + z^2/n) -/+ z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)
    assert h100["failed_lo"] == pytest.approx(0.061490, abs=1e-5) and h100["failed_hi"] == pytest.approx(0.792340, abs=1e-5)
    a100 = rows[("NVIDIA A100", "abc")]
    assert (a100["groups"], a100["failed"]) == (1, 0)
    # none failed in 4: the upper end is z^2 / (n + z^2) = 3.8416 / 7.8416
    assert pooled([_group(f"r{i}", 0.3) for i in range(4)], 1.0)[0]["failed_hi"] == pytest.approx(0.489900, abs=1e-5)
    assert pooled([_group("r", 1.0)], 1.0)[0]["failed"] == 0  # the rule is margin <= tolerance
    assert set(SETTING) == set(SETTING_KEYS)


@pytest.mark.integration
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
