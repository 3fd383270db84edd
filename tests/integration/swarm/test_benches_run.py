"""Every benchmark of swarm/ runs, at its smallest (tests/integration/node/test_benches_run.py says
why): real peers, real processes, the emulated WAN where the bench needs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.external import cannot
from helpers.repo import ROOT


def run_bench(argv: list[str], timeout: float, tmp: Path) -> str:
    """The bench's printout; its work folders (tempfile.mkdtemp, kept for a user to read) go under
    `tmp`, the test's, not the machine's /tmp (hivemind's sockets stay in /tmp: their own path)."""
    out = subprocess.run([sys.executable, str(ROOT / "examples" / argv[0]), *argv[1:]], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, "TMPDIR": str(tmp)})
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out.stdout


def test_the_distribution_bench_runs_each_schedule_and_repeats(tmp_path):
    printed = run_bench(["bench_distribution.py", "--mb", "2", "--ns", "1", "2", "--repeat", "2", "--patch-mb", "1",
                         "--segment", "3"], 600, tmp_path)
    assert len(re.findall(r"(?m)^\s+2\s+(staggered|simultaneous|no sharing)\s", printed)) == 3, printed
    assert "median of 2" in printed, printed  # a second repetition runs (it failed before: issue 60)
    assert "fetch failures 0," in printed, printed  # the baseline's fetches too: its samplers are proven
    # the manifest's tail after the version a sampler holds, the notice in its place, and the whole
    # segment (v1's every reply)
    rows = re.findall(r"(?m)^\s+(\d+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s",
                      printed.split("the manifest as the segment grows")[-1])
    assert [int(r[0]) for r in rows] == [1, 3], printed[-3000:]
    sizes = [tuple(int(x.replace(",", "")) for x in r[1:]) for r in rows]
    assert all(notice < tail < whole for tail, notice, whole in sizes), rows


def test_the_many_peers_bench_runs(tmp_path):
    printed = run_bench(["bench_many.py", "--peers", "4", "--window", "10", "--newcomers", "1"], 600, tmp_path)
    assert "goal: a newcomer knows the learner" in printed, printed[-3000:]


def test_the_soak_bench_runs_with_churn_and_an_attack(tmp_path):
    printed = run_bench(["bench_soak.py", "--minutes", "3", "--churn-s", "60", "--attack-every-s", "70",
                         "--sample-s", "5"], 420, tmp_path)
    assert re.search(r"soak of \d", printed) and "attack 1 done" in printed, printed[-3000:]


def test_the_wan_bench_spreads_versions_to_earned_mates(tmp_path):
    from examples.wan import skip_reason

    cannot(skip_reason())
    printed = run_bench(["bench_wan.py", "--samplers", "3", "--patch-mb", "1", "--versions", "2", "--interval", "6",
                         "--rate-mbit", "50", "--rtt-ms", "20"], 600, tmp_path)
    assert "knows its 3 public mates" in printed and "goals:" in printed, printed[-3000:]
    assert re.search(r"CPU per version while it spread \(median\): the swarm [\d.]+ s", printed), printed[-3000:]


def test_the_wan_bench_behind_home_routers_prints_the_limit_nat_leaves(tmp_path):
    from examples.internet import skip_reason

    cannot(skip_reason())  # the WAN's, and nftables for the routers' NAT
    printed = run_bench(["bench_wan.py", "--samplers", "3", "--behind-nat", "2", "--patch-mb", "1", "--versions", "2",
                         "--interval", "6", "--rate-mbit", "50"], 600, tmp_path)
    # 1 public sampler: as the swarm runs, the 3 copies but the learner's cross its uplink
    limit = re.search(r"behind NAT, 2 of 3 samplers reach only the learner and the 1 public ones: the limit is "
                      r"([\d.]+) copy-times", printed)
    assert limit and 1.0 <= float(limit.group(1)) <= 2.0, printed[-3000:]


def test_a_new_swarms_samplers_share_its_keyframe_through_the_seeders_its_learner_names(tmp_path):
    """No one is credited yet: samplers joining one after another take v0 from the first, whom the
    learner's tally names as a seeder (swarm/discovery.py `seeders`), not one copy each from the
    learner (3 here before seeders). 20 s apart: the first holds v0 and the learner's tally (every
    5 s here) names it before the next sampler's first look at it."""
    from examples.wan import skip_reason

    cannot(skip_reason())
    printed = run_bench(["bench_wan.py", "--samplers", "3", "--keyframe-mb", "4", "--patch-mb", "1", "--versions", "1",
                         "--interval", "4", "--join-every", "20", "--rate-mbit", "50", "--rtt-ms", "20"], 600, tmp_path)
    copies = re.search(r"keyframe .* the learner uploaded ([\d.]+) copies \(one a sampler: 3\)", printed)
    assert copies and float(copies.group(1)) < 1.5, printed[-3000:]


def test_the_demo_bench_says_where_a_run_went(tmp_path):
    printed = run_bench(["bench_demo.py", "--steps", "10"], 300, tmp_path)
    # each node's CPU (the demo's own children, found through /proc), and the learner's loop by phase
    for node in ("learner", "sampler-0", "sampler-1", "bootstrap", "leaderboard"):
        assert re.search(rf"(?m)^{node}\s+\d+\.\d\s", printed), (node, printed[-3000:])
    assert "the learner's run:" in printed and re.search(r"(?m)^\s+train\s+\d+\.\d s", printed), printed[-3000:]
    # the gain from the learner's own eval records, first to last, as the demo's summary reports it
    assert re.search(r"eval accuracy \(the learner's metrics\): v0 [\d.]+% -> v10 [\d.]+% \([+-][\d.]+ points\)",
                     printed), printed[-3000:]
    assert re.search(r"goal \(issue 60\): \+20 points within 60 s .* points in [\d.]+ s: (met|not met)", printed), \
        printed[-3000:]


def test_the_flood_bench_runs_at_both_priorities(tmp_path):
    """Two fresh keys flood a proven sampler's learner, at the swarm's priority and at nice 19: a row
    each, with what the learner's doors did with the flood (accepted / busy / refused)."""
    # 6 s windows: the baseline's rate needs two of the learner's steps in it (n/a where a slow CPU fits fewer)
    printed = run_bench(["bench_flood.py", "--seconds", "6", "--keys", "2"], 420, tmp_path)
    for label in ("same priority", "nice 19"):
        assert re.search(rf"(?m)^2 key\(s\), {label}\s+[\d.]+ ->\s+[\d.]+\s+(\d+%|n/a)\s+\d+\s+\d+\s+\d+\s+\d+\s", printed), \
            (label, printed[-3000:])
    assert printed.count("flood: ") == 2 and "busy by bound" in printed, printed[-3000:]
