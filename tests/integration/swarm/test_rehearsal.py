"""The rehearsal at a real vocabulary, short (examples/rehearsal.py): a bootstrap, a learner and two
samplers as processes on a Qwen3-shaped model with 151,936 tokens, for a few versions. A change
that breaks real sizes (a peer record that expires during a long step, a fetch that stalls on a
version of tens of MB, a bound that fires on honest traffic) fails here, not on a volunteer's GPU."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings as pywarnings
from pathlib import Path


from cli.procs import P2PD_LOGS
from helpers.repo import ROOT

FAILURES = ("bad_streams", "bad_chunks", "weight_fetch_failures", "forged_manifests",
            "send_failures", "batch_errors", "rejected", "audit.failed", "refused_samplers")
"""What must never happen to honest traffic: a stream or chunk taken for a lie, a fetch or a send
that failed, a group or a sampler refused. (Hedges and stalls, a slow answer asked again
elsewhere, and a rollout call sent again at once because its stream ended unanswered (`retried`),
can come from this 2-core machine's load alone: the full rehearsal reports them.)"""
VERSIONS = 3


P2PD_SIGNS = ("error dialing handler", "error accepting stream", "unexpected stream", "protocol mux failed",
              "protocol EOF", '"level":"error"')
"""What p2pd logs when it ends a stream itself: where a stream that ended unanswered (a sender's
`retried`) came from, which our own logs never showed (docs/DESIGN.md, "unanswered stream").
Not its "stream error: stream reset" (debug), ~140 of which every run logs: streams closed after
their answer."""
P2PD_ROUTINE = "use of closed network connection"
"""The error p2pd logs for its listener as its node stops."""


def p2pd_signs(logs: Path) -> list[str]:
    """Lines of each node's p2pd log (cli/procs.P2PD_LOGS) that say it ended a stream itself."""
    return [f"{log.name}: {line.strip()[:400]}" for log in sorted(logs.glob("*.p2pd.log"))
            for line in log.read_text(errors="replace").splitlines()
            if any(sign in line for sign in P2PD_SIGNS) and P2PD_ROUTINE not in line][-40:]


def warnings(logs: Path) -> list[str]:
    """Each node's warning and error lines: what a failed assertion needs to say why (the run's
    folder is gone by the time CI prints it)."""
    return [f"{log.stem}: {line.strip()}" for log in sorted(logs.glob("*.log"))
            for line in log.read_text(errors="replace").splitlines() if "WARNING" in line or "ERROR" in line][-40:]


def test_rehearsal_at_a_real_vocabulary(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "rehearsal.py"), "--shape", "wide-vocab-tiny", "--layers", "0",
         "--completion-len", "48", "--versions", str(VERSIONS), "--minutes", "20", "--run-dir", str(tmp_path)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, P2PD_LOGS: "1"})
    try:
        out, _ = proc.communicate(timeout=25 * 60)
    finally:
        if proc.poll() is None:  # it stops and reaps its swarm itself; this only ends a hung run
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-4000:]
    assert "ORPHANED" not in out
    got = json.loads((tmp_path / "rehearsal.json").read_text())
    rows = got["rows"]
    assert [r["version"] for r in rows][:VERSIONS] == list(range(1, VERSIONS + 1)), out[-4000:]
    assert all(r["bytes"] > 0 and r["kind"] in ("patch", "keyframe") for r in rows), rows  # each version published
    last = rows[VERSIONS - 1]
    for sampler, held in got["held"].items():
        # every sampler held the last version whole and checked (a sampler that falls behind may
        # skip patches older than a keyframe, never the newest)
        assert str(last["version"]) in held, (sampler, last["version"], held)
        assert held[str(last["version"])] >= last["published_at"] - 1.0
    fired = {(who, k): v for who, counts in got["fired_total"].items() for k, v in counts.items()}
    failed = {f"{who} {k}": v for (who, k), v in fired.items() if k in FAILURES or k.split(".", 1)[-1] in FAILURES}
    assert not failed, (failed, warnings(tmp_path / "logs"), p2pd_signs(tmp_path / "logs"))
    retried = {f"{who} {k}": v for (who, k), v in fired.items() if k.endswith("retried")}
    if retried:  # harmless (sent again), but its cause is open: CI's warnings summary says what p2pd saw
        pywarnings.warn(f"rollout calls sent again {retried}; p2pd: {p2pd_signs(tmp_path / 'logs') or 'nothing'}")
    for log in (tmp_path / "logs").glob("s*.log"):
        assert "gone from the swarm" not in log.read_text(), log  # the learner's record lived through its steps
    assert len(got["tokens_per_s"]) == 2 and all(rates and min(rates) > 0 for rates in got["tokens_per_s"].values())
