"""FSDP2 on 2 gloo ranks under torchrun trains exactly as one process does (node/training/distributed.py).

Each test starts `torchrun --standalone --nproc-per-node 2 tests/helpers/fsdp_worker.py MODE OUT` as
real processes; rank 0 saves the gathered weights, optimizer state and metrics, and the test
compares them with the same steps run here, in one process, without FSDP and without micro-batches.
The model is the built-in tiny Qwen3 (tied embeddings) in float64: see helpers/fsdp_worker.py,
DTYPE. The same calls in one process, without torchrun: tests/unit/node/test_distributed.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.repo import HELPERS, ROOT

WORKER = HELPERS / "fsdp_worker.py"
TIMEOUT_S = 240


@pytest.fixture(scope="module")
def reference():
    from helpers import fsdp_worker

    return fsdp_worker, fsdp_worker.reference()


def _torchrun(tmp_path: Path, mode: str, *args: str) -> dict:
    """Run the worker on 2 ranks; rank 0's saved results. Leftover processes are killed by PID."""
    out = tmp_path / f"{mode}.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(WORKER), mode, str(out), *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # torchrun stops its workers on SIGTERM
        try:
            output, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            output = ""
        pytest.fail(f"torchrun {mode} did not finish in {TIMEOUT_S} s:\n{output[-4000:]}")
    finally:
        _kill(proc, sorted(tmp_path.glob(f"{out.name}.rank*.pid")))
    print(f"torchrun {mode}: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, f"torchrun {mode} exited with {proc.returncode}:\n{output[-6000:]}"
    return torch.load(out, weights_only=False)


def _kill(proc: subprocess.Popen, pid_files: list[Path]) -> None:
    """torchrun (its own session) and its workers (a session each) if still running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    for f in pid_files:
        pid = int(f.read_text())
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if WORKER.name.encode() in cmdline:  # not a reused PID
            os.kill(pid, signal.SIGKILL)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _assert_same(weights: dict, ref_weights: dict, what: str) -> float:
    assert list(weights) == list(ref_weights), what  # the unwrapped HF model's names and order, tied head included
    for k in ref_weights:
        # absolute: AdamW moves a weight by lr * delta / eps for a gradient rounding delta, whatever
        # the weight's size (fsdp_worker.DTYPE); float64 keeps that far under 1e-6
        torch.testing.assert_close(weights[k], ref_weights[k], rtol=0, atol=1e-6, msg=lambda m: f"{what}: {k}: {m}")
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"], "tied weights gathered as one tensor"
    diff = _max_diff(weights, ref_weights)
    print(f"{what}: max |w_2ranks - w_1process| = {diff:.3g}")
    return diff


def _assert_same_optimizer(optim: dict, ref_optim: dict, what: str) -> None:
    """AdamW's state, keyed by parameter name; exp_avg is not scale invariant (a gradient off by the
    world size would show here, not in the weights)."""
    assert optim["state"].keys() == ref_optim["state"].keys()
    assert optim["param_groups"][0]["params"] == ref_optim["param_groups"][0]["params"]
    for k, st in ref_optim["state"].items():
        assert float(optim["state"][k]["step"]) == float(st["step"])
        for n in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(optim["state"][k][n], st[n], rtol=1e-4, atol=1e-9,
                                       msg=lambda m: f"{what}: {k}.{n}: {m}")


def _assert_same_metrics(metrics: list[dict], ref_metrics: list[dict]) -> None:
    for m, r in zip(metrics, ref_metrics, strict=True):
        assert m["step_skipped"] == r["step_skipped"] == 0
        assert m["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-6)  # clipped in every step
        assert m["loss"] == pytest.approx(r["loss"], rel=1e-5)  # float64, summed in another order
        assert m["routes"]["stale"]["dropped_groups"] == r["routes"]["stale"]["dropped_groups"] == [1]
        assert m["routes"]["stale"]["sequences"] == r["routes"]["stale"]["sequences"]


def test_two_ranks_train_the_same_weights_as_one_process(reference, tmp_path):
    from node.models import BUILTIN_MODEL, load_model, load_tokenizer
    from node.training.step import _deal, plan_microbatches

    worker, ref = reference
    t0 = time.monotonic()
    # the steps are cut fine: every rank runs several micro-batches, groups are split, an idle rank
    # runs the dummy pass in some step
    tok, base = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL, worker.DTYPE)
    idle = 0
    for s in range(worker.STEPS):
        parts = worker.make_parts(tok, base, s)
        batch = parts[0].batch
        plan = plan_microbatches(batch.packed.attention_mask.sum(-1).tolist(), worker.BUDGET)
        assert len(plan) >= 6
        assert sum(len({int(batch.group_ids[i]) for i in rows}) > 1 for rows in plan) >= 1
        dealt = _deal(parts, worker.BUDGET, 2)
        assert all(sum(w is not None for w in rank) >= 3 for rank in dealt)
        idle += sum(w is None for rank in dealt for w in rank)
    assert idle >= 1

    got = _torchrun(tmp_path, "spmd")
    ref_weights, ref_optim, _ = ref[-1]
    _assert_same(got["weights"], ref_weights, f"after {worker.STEPS} steps")
    _assert_same_optimizer(got["optim"], ref_optim, "optimizer")
    _assert_same_metrics(got["metrics"], [m for _, _, m in ref])
    print(f"test took {time.monotonic() - t0:.1f} s")


def test_rank0_leads_a_follower_through_steps_state_gathers_and_a_resume(reference, tmp_path):
    worker, ref = reference
    t0 = time.monotonic()
    one_process = tmp_path / "one_process_after_2_steps.pt"  # a checkpoint of a learner in one process
    torch.save({"weights": ref[1][0], "optim": ref[1][1]}, one_process)
    got = _torchrun(tmp_path, "leader", str(one_process))
    _assert_same(got["weights2"], ref[1][0], "Leader, after 2 steps")
    _assert_same_optimizer(got["optim2"], ref[1][1], "Leader's optimizer state after 2 steps")
    _assert_same(got["weights3"], ref[2][0], "Leader, after 3 steps")
    # step 3 again after loading the state gathered after step 2: what the first step 3 gave
    for k, v in got["weights3"].items():
        torch.testing.assert_close(got["weights3_again"][k], v, rtol=0, atol=1e-12, msg=lambda m: f"{k}: {m}")
    # ... and after loading the one-process checkpoint: the one-process step 3
    _assert_same(got["weights3_resumed"], ref[2][0], "Leader, step 3 resumed from one process's checkpoint")
    _assert_same_metrics(got["metrics"], [m for _, _, m in ref])
    print(f"test took {time.monotonic() - t0:.1f} s")


def test_two_rank_learner_trains_in_a_loopback_swarm(tmp_path):
    """`hetero-node join --role learner --nproc-per-node 2` starts torchrun; rank 0 joins the
    swarm, takes rollouts from a real sampler and leads rank 1 through FSDP2 steps; it publishes
    versions the sampler follows, and stops at --max-steps with a checkpoint (both ranks exit)."""
    from helpers.swarmkit import Swarm, start_bootstrap

    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        learner = s.start_learner("[learner]\neval_every = 0\neval_size = 30\nmax_tokens_per_microbatch = 256\n",
                                  "--nproc-per-node", "2", "--max-steps", "8", "--device", "cpu")
        s.join("sampler", "sampler")
        assert s.wait_version(8, timeout=420) >= 8
        assert learner.popen.wait(timeout=180) == 0
        steps = [r for r in s.metrics() if r["kind"] == "step"]
        assert len(steps) == 8
        # a step whose groups all lack signal (every reward equal) has nothing to train: it sends
        # rank 1 nothing and records no optimizer step (node/training/trainer.py). The first step
        # takes a new sampler's first 4 groups (its admission), each without signal in 14 of 36
        # measured here: all four in ~2% of runs (one CI run met it). Every other step trains.
        empty = [r for r in steps if r["groups_skipped_zero_var"] == r["groups_own"] + r["groups_foreign"]]
        trained = [r for r in steps if r not in empty]
        assert all("step_skipped" not in r for r in empty)
        assert trained and all(r["step_skipped"] == 0 and r["grad_norm"] > 0 for r in trained)
        log = learner.log_path.read_text()
        assert "FSDP2 over 2 processes" in log and f"learner rank 1: stopped after {len(trained)} steps" in log
        assert list((tmp_path / "learner" / "checkpoints").glob("*"))
    finally:
        s.stop_all()
