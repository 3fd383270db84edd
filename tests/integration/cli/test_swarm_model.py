"""A volunteer pastes the coordinator's command and nothing else: its sampler, on a workdir that has
never seen the model, runs the model the learner trains (a local checkpoint at a 151,936-token
vocabulary, on no hub) from the learner's files and keyframe, and earns credit; `doctor` with the
same address checks the swarm's model against this machine; a volunteer who runs another model is
told so in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from helpers.swarmkit import Swarm, peer_of, start_bootstrap
from helpers.wide_arith import save_wide_arith

LEARNER = """model = "{model}"
[learner]
groups_per_step = 4
eval_every = 0
eval_size = 8
"""


def credited(s: Swarm, peer: str) -> int:
    steps = [r for r in s.metrics() if r.get("kind") == "step"]
    return max((r.get("credited", {}).get(peer, 0) for r in steps), default=0)


def test_a_sampler_given_only_the_bootstrap_runs_the_swarms_model(tmp_path: Path) -> None:
    model = save_wide_arith(tmp_path / "their-checkpoint")
    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        s.start_learner(LEARNER.format(model=model))
        volunteer = s.start("volunteer", ["join", "--role", "sampler", "--initial-peers", s.addr, "--no-nat",
                                          "--workdir", str(tmp_path / "volunteer")])
        other = s.start("other", ["join", "--role", "sampler", "--initial-peers", s.addr, "--no-nat",
                                  "--workdir", str(tmp_path / "other"), "--model", "builtin:tiny-arith-b"])
        peer = peer_of(s, "volunteer")
        deadline = time.monotonic() + 420
        while credited(s, peer) == 0 and time.monotonic() < deadline:
            assert volunteer.popen.poll() is None, volunteer.log_path.read_text()[-3000:]
            time.sleep(2)
        log = volunteer.log_path.read_text()
        assert credited(s, peer) > 0, (s.metrics()[-1:], log[-3000:])
        assert f"running the swarm's model '{model}'" in log, log[-3000:]
        files = list((tmp_path / "volunteer" / "swarm-model").iterdir())
        assert len(files) == 1 and (files[0] / "tokenizer.json").is_file()
        assert not list(files[0].glob("*.safetensors"))  # the weights came as the learner's keyframe
        # the preflight with the coordinator's address alone: the swarm's model, from its learner
        out = subprocess.run([sys.executable, "-m", "cli.main", "doctor", "--initial-peers", s.addr, "--role", "sampler",
                              "--json"], capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        report = json.loads(out.stdout[out.stdout.index("{"):])
        assert report["swarm"]["model"] == str(model) and report["swarm"]["rate_mb_s"] > 0, report["swarm"]
        assert report["model"]["vocab"] == 151936 and report["verdicts"][0]["ok"], report["verdicts"]
        said = " ".join(other.log_path.read_text().split())  # rich wraps a long line
        assert "rejoin without --model" in said, said[-3000:]
        # a warning once (the first time the swarm's models are seen), then the same line quietly
        assert said.count("WARN waiting for a learner of model 'builtin:tiny-arith-b'") == 1, said[-3000:]
    finally:
        s.stop_all()
