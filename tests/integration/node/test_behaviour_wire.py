"""The learner's own behaviour log-probs (`behaviour_logprobs = "learner"`, node/learner/behaviour.py)
over the real protocol: a forger's claims are dropped and counted, a bfloat16 sampler's are not.
The computation itself, in one process: tests/unit/node/test_behaviour.py."""

from __future__ import annotations

import time

import pytest

from node.learner.config import BehaviourConfig


# audits off: what stops forged claims here is the recomputation's check alone (with audits on, the
# attacker's first audited group would refuse it before any step:
# tests/integration/node/test_steering.py)
SWARM_TOML = ('[learner]\nbehaviour = { source = "learner" }\naudit = { first = 0, rate = 0.0, rate_established = 0.0 }\n'
              'eval_every = 0\n')


@pytest.mark.timeout(600)
def test_over_the_wire_forged_claims_are_dropped_and_counted_and_a_bfloat16_samplers_are_not(tmp_path, capsys):
    from helpers.swarmkit import Swarm, peer_of, start_bootstrap

    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        s.start_learner(SWARM_TOML)
        s.join("honest", "sampler", "--name", "honest", "--dtype", "bfloat16")
        s.join_attacker("forger", "logprobs")  # its own key; honest tokens, claims of -18/token
        honest, forger = peer_of(s, "honest"), peer_of(s, "forger")
        s.wait_version(3, timeout=240)
        deadline = time.monotonic() + 300
        while True:
            steps = [r for r in s.metrics() if r["kind"] == "step"]
            if steps and steps[-1]["logprob_gap_drops"].get(forger, 0) >= 2 and steps[-1]["version"] >= 6:
                break
            assert time.monotonic() < deadline, f"the forger's groups were never dropped: {steps[-1:]}"
            time.sleep(1)
        last = steps[-1]
        with capsys.disabled():
            print(f"\nv{last['version']}: gap drops {last['logprob_gap_drops']}, drops {last['drops']}, "
                  f"claims' k3 {[round(r['behaviour_k3'], 8) for r in steps if 'behaviour_k3' in r][-5:]}")
        assert last["logprob_gap_drops"].get(honest, 0) == 0
        assert last["drops"]["logprob_gap"] >= last["logprob_gap_drops"][forger]
        assert last["credited"].get(forger, 0) == 0
        recomputed = [r for r in steps if r.get("behaviour_recomputed")]
        assert recomputed and all(r["behaviour_claims_kept"] == 0 for r in recomputed)
        # the honest sampler's bfloat16 claims differ from the learner's float32 log-probs, by rounding
        assert max(r["behaviour_k3"] for r in recomputed) > 0 and max(r["behaviour_gap_mean"] for r in recomputed) < 0.1
        # the recomputation, not the trainer's own check, stopped the forged claims: the trainer
        # dropped nothing, and its largest gap is within its own bound (a forged claim's is >= 13/token).
        # What it does see is staleness: the learner's log-probs at the version a group claims against
        # the step's weights some versions on (CI saw 1.09 on a slow machine; up to 2.07 honest at 64
        # versions stale, examples/bench_logprob_gap.py), so the bound is the trainer's, not a guess below it
        own = [r["routes"]["own"] for r in steps if "own" in r.get("routes", {})]
        assert own and not any(r["dropped_groups"] for r in own)
        assert max(r["logprob_gap_max"] for r in own) <= BehaviourConfig().max_logprob_gap
        # the rollout correction (on by default) weighs the honest bfloat16 engine's tokens near 1
        weights = [r["routes"]["own"]["rollout_weight_mean"] for r in steps if "own" in r.get("routes", {})]
        assert weights and all(0.9 < w < 1.1 for w in weights)
    finally:
        s.stop_all()
