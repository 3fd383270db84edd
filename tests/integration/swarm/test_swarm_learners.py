"""Three learners of three models in one loopback swarm, each with its own sampler (issue: several
learners, one swarm). Real processes: a coordinator naming the three learners with their models,
each learner taking the other two models' rollouts (F-TIS), each sampler following its own
model's learner and sending a copy of every group to the other two."""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path


from node.models import BUILTIN_MODEL, BUILTIN_MODEL_B, BUILTIN_MODEL_C
from swarm.identity import Identity
from helpers.swarmkit import Swarm, wait_for_file
from helpers.jsonl import read_jsonl

MODELS = {"a": BUILTIN_MODEL, "b": BUILTIN_MODEL_B, "c": BUILTIN_MODEL_C}
STEPS = 40


def learner_toml(model: str) -> str:
    others = ", ".join(f'"{m}"' for m in MODELS.values() if m != model)
    return ("[learner]\neval_every = 10\neval_size = 200\nmax_staleness = 1000\ngroups_per_step = 8\n"
            f"foreign = {{ step_share = 0.5, per_sampler = 2, accept_models = [{others}] }}\n")


def metrics(base: Path, name: str) -> list[dict]:
    path = base / name / "metrics.jsonl"
    return read_jsonl(path)


def version(base: Path, name: str) -> int:
    return max((r["version"] for r in metrics(base, name) if r["kind"] == "step"), default=0)


def wait_versions(s: Swarm, names: list[str], steps: int, timeout: float) -> None:
    """Until every learner in `names` (workdirs under the swarm's folder) reached version `steps`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and min(version(s.base, n) for n in names) < steps:
        time.sleep(2)
    done = {n: version(s.base, n) for n in names}
    assert min(done.values()) >= steps, f"learners stopped at {done}; logs in {s.logs}"


def last_step(base: Path, name: str) -> dict:
    return next((r for r in reversed(metrics(base, name)) if r["kind"] == "step"), {})


def wait_fed(s: Swarm, wanted: dict[str, list[str]], timeout: float) -> None:
    """Until each learner (its workdir under the swarm's folder) has trained on groups from every
    sampler it is `wanted` to (or the timeout: the assertions that follow say who is missing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(last_step(s.base, name).get("accepted_by_sampler", {}).get(p, 0) > 0
               for name, peers in wanted.items() for p in peers):
            return
        time.sleep(1)


def test_three_learners_learn_and_each_trains_on_the_other_models_rollouts(tmp_path):
    s = Swarm(tmp_path)
    ids = {k: Identity.load_or_create(tmp_path / f"learner-{k}" / "identity.key").peer_id for k in MODELS}
    samplers = {k: Identity.load_or_create(tmp_path / f"sampler-{k}" / "identity.key").peer_id for k in MODELS}
    # two learners named on the command line with their models, the third through the learners file
    (tmp_path / "learners.txt").write_text(f"# added while the swarm runs\n{ids['c']}={MODELS['c']}\n")
    boot = s.start("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                 "--identity", str(tmp_path / "boot.key"), "--addr-file", str(tmp_path / "boot.addr"),
                                 "--trusted-learner", f"{ids['a']}={MODELS['a']}",
                                 "--trusted-learner", f"{ids['b']}={MODELS['b']}",
                                 "--learners-file", str(tmp_path / "learners.txt")])
    s.addr = wait_for_file(tmp_path / "boot.addr", 90, boot).decode().split()[0]
    try:
        for k, model in MODELS.items():
            (tmp_path / f"learner-{k}.toml").write_text(learner_toml(model))
            # no --max-steps: a learner trains on its partners' groups before its own sampler's first
            # arrive, so a tiny one could reach any fixed step count on those alone (it did in CI:
            # learner c's 40 steps held none of its own sampler's groups); it runs until all is seen
            s.join(f"learner-{k}", "learner", "--model", model, "--config", str(tmp_path / f"learner-{k}.toml"))
        # samplers join once the learners are there, so that they know their partners from the start
        # (they look again every 10 s)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum(p["role"] == "learner" for p in s.status()) < 3:
            time.sleep(2)
        for k, model in MODELS.items():
            s.join(f"sampler-{k}", "sampler", "--model", model, "--name", f"sampler-{k}")
        wait_versions(s, [f"learner-{k}" for k in MODELS], STEPS, timeout=600)
        wait_fed(s, {f"learner-{k}": list(samplers.values()) for k in MODELS}, timeout=300)
    finally:
        s.stop_all()

    gains: dict[str, float] = {}
    for k, model in MODELS.items():
        rows = metrics(tmp_path, f"learner-{k}")
        steps = [r for r in rows if r["kind"] == "step"]
        accepted = steps[-1]["accepted_by_sampler"]
        others = [o for o in MODELS if o != k]
        # its own sampler's groups and both other models' reached it and were trained on
        why = (k, accepted, steps[-1]["drops"], steps[-1]["refused_samplers"])
        assert accepted.get(samplers[k], 0) > 0, why
        for o in others:
            assert accepted.get(samplers[o], 0) > 0, (o, *why)
        assert sum(r.get("groups_foreign", 0) for r in steps) > 0
        assert any("foreign" in r.get("routes", {}) for r in steps)  # F-TIS on the partners' rollouts
        evals = [r["eval_acc"] for r in rows if r["kind"] == "eval"]
        print(f"learner {k} ({model}): eval {evals}, accepted {accepted}")
        assert len(evals) >= 3, (k, evals)
        # none collapsed: its better last eval within 7 points of its start (2 SDs of one 200-problem
        # eval, 3.5 points; the simulator's worst at these settings was 1 point under, under GRPO,
        # the default then: a collapse is what this guards, whichever loss is the default)
        assert max(evals[-2:]) >= evals[0] - 0.07, (k, evals)
        gains[k] = statistics.mean(evals[-2:]) - evals[0]
    # the swarm learns: the learners' mean gain (mean of the last two evals minus the start) is positive.
    # Per learner a gain has no power here: in the simulator at these settings tiny-arith-b gained -1.75
    # to +3.75 points at v30-v40 over 8 seeds, below its start once; the mean over the three, +7.4 to
    # +12.4 (docs/RESULTS.md, "The three-learner test's learning check"). The learners run past v40
    # until each has all three samplers' groups, so the last two evals may come later
    print(f"gains {gains}")
    assert statistics.mean(gains.values()) > 0, gains
    # each sampler followed its own model's learner and fed the other two, acknowledged by each
    for k in MODELS:
        log = (s.logs / f"sampler-{k}.log").read_text()
        # (a long line wraps in the log: "took" and its count may be a line apart)
        fed = dict(re.findall(r"(\S+) took\s+(\d+)", log.split("partner learners:")[-1]))
        assert len(fed) == 2 and all(int(n) > 0 for n in fed.values()), (k, fed)


def test_two_nodes_that_are_sampler_and_learner_train_on_their_own_groups_and_each_others(tmp_path):
    """`join --role sampler,learner`, twice (two models): each node generates with its own learner's
    weights in memory, trains on that, and feeds the other node's learner through the swarm."""
    s = Swarm(tmp_path)
    pair = {"a": MODELS["a"], "c": MODELS["c"]}
    ids = {k: Identity.load_or_create(tmp_path / f"node-{k}" / "identity.key").peer_id for k in pair}
    boot = s.start("bootstrap", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                 "--identity", str(tmp_path / "boot.key"), "--addr-file", str(tmp_path / "boot.addr"),
                                 *[a for k in pair for a in ("--trusted-learner", f"{ids[k]}={pair[k]}")]])
    s.addr = wait_for_file(tmp_path / "boot.addr", 90, boot).decode().split()[0]
    try:
        for k, model in pair.items():
            other = next(m for m in pair.values() if m != model)
            (tmp_path / f"node-{k}.toml").write_text(
                "[learner]\neval_every = 0\ngroups_per_step = 8\n"
                f"foreign = {{ step_share = 0.25, per_sampler = 2, accept_models = [\"{other}\"] }}\n")
            # no --max-steps: these tiny nodes take 120 steps in 9-14 s, and a node finds its partner
            # learner at its first look at the swarm or 10 s later (LearnerTracker's `every`); in a
            # full integration run node a's first look missed, and it found c only after c stopped at 120
            s.join(f"node-{k}", "sampler,learner", "--model", model, "--config", str(tmp_path / f"node-{k}.toml"))
        wait_versions(s, [f"node-{k}" for k in pair], 120, timeout=400)
        wait_fed(s, {"node-a": [ids["c"]], "node-c": [ids["a"]]}, timeout=120)  # each took the other's
    finally:
        s.stop_all()  # SIGTERM: each node says what its sampler made and what its partner took
    for k in pair:
        other = next(o for o in pair if o != k)
        steps_k = [r for r in metrics(tmp_path, f"node-{k}") if r["kind"] == "step"]
        accepted = steps_k[-1]["accepted_by_sampler"]
        assert accepted.get(ids[k], 0) > 0, (k, accepted)  # its own groups, made in memory
        assert accepted.get(ids[other], 0) > 0, (k, accepted)  # the other node's, over the swarm
        # its own work is not audited (same weights, same process), a partner's never is, and neither is credited
        assert steps_k[-1]["audit"]["audits"] == 0 and steps_k[-1]["credited"] == {}
        # on-policy: made by the current weights, trained on within two steps
        assert max(int(v) for r in steps_k for v in r["staleness_hist"]) <= 2
        log = (s.logs / f"node-{k}.log").read_text()
        assert re.search(r"own sampler made \d+ groups; partner learners: \S+ took [1-9]", log), log[-2000:]
