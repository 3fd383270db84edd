"""examples/bench_honest_groups.py: honest groups pooled over runs per setting, by hand. One tiny
run end to end (sample, audit, append, pool): tests/integration/node/test_honest_groups_run.py."""

import pytest

from examples.bench_honest_groups import SETTING_KEYS, pooled

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
