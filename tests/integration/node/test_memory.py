"""The learner's memory follows its token budget, not the batch: measured in fresh processes."""

import os
import subprocess
import sys
from pathlib import Path

from helpers.external import cannot
from helpers.repo import HELPERS

PROBE = HELPERS / "memory_probe.py"
VOCAB = 151936


def peak(budget: int, groups: int, *extra: str) -> int:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(PROBE), str(budget), str(groups), *extra], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    return int(out.stdout.split()[-1])


def test_peak_memory_is_flat_in_groups_per_step_and_far_below_full_logits():
    """A 151,936-token vocabulary (Qwen3's) under a tiny body, so the output head is what memory
    is about. With several full micro-batches (16 rows of 32 tokens under a 512-token budget:
    gradients then accumulate), 3x the groups per step must not grow the step's peak by more than
    a quarter of one [B, L, V] float32 copy of the smaller step's logits, whereas the full-logits
    path needs several such copies."""
    cannot(None if Path("/proc/self/clear_refs").exists() else "needs Linux /proc (clear_refs) to measure peak memory")
    logits_8 = 8 * 4 * (8 + 24) * VOCAB * 4  # bytes of [B, L, V] float32 for 8 groups
    small, large = peak(512, 8), peak(512, 24)
    full = peak(0, 8, "full")
    print(f"\npeak above baseline: 8 groups {small / 2**20:.0f} MiB, 24 groups {large / 2**20:.0f} MiB; "
          f"full logits, 8 groups {full / 2**20:.0f} MiB ([B, L, V] float32 = {logits_8 / 2**20:.0f} MiB)")
    assert large < small + logits_8 / 4
    assert full > 2 * logits_8  # the baseline really materialises the logits (the probe measures)
    assert large < full / 2
