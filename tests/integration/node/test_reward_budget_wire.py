"""A stranger's groups that cost math-verify seconds, over the real protocol, against a real learner
of a dataset task (its rewards scored by math-verify in its worker process, node/tasks/bounded.py):
they pass every check before the ack, are dropped at ingest as `reward_budget` within the group's
budget, counted, never trained on or credited, and the learner keeps stepping on the honest
sampler's groups. (Before: ~5.3 s of the training thread per completion, 42 s a group.)
tests/unit/node/test_reward_budget.py tests the same through the learner's ingest in-process.
"""

from __future__ import annotations

import json
import time
import uuid

import msgpack
import pytest

from helpers.slow_rewards import EVADES, TOWER
from helpers.swarmkit import Swarm, peer_of, start_bootstrap
from node.models import BUILTIN_MODEL, load_tokenizer, tokenizer_hash
from node.tasks import DatasetTask, DatasetTaskConfig
from swarm.dht.network import NetworkConfig
from swarm.wire.envelope import seal
from swarm.identity import Identity
from swarm.wire.rollout import CompletionRecord, RolloutGroup
from swarm.wire.batch import ROLLOUTS


def _config(role: str, data: str) -> str:
    return "\n".join([
        f'role = "{role}"', 'swarm = "demo"', f'model = "{BUILTIN_MODEL}"',
        "[task]", 'kind = "dataset"', f"train_files = [{json.dumps(data)}]", 'chat_template = "off"', "eval_fraction = 0.1",
        "[sampling]", "group_size = 8", "temperature = 1.0", "max_new_tokens = 24",
        "[learner]", "groups_per_step = 4", "eval_every = 0", "checkpoint = { every = 10 }", "max_staleness = 100000", ""])


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    base = tmp_path_factory.mktemp("reward_budget")
    data = base / "qa.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"What is {a} + {b}?", "answer": str(a + b)})
                              for a in range(10) for b in range(10)))
    s = Swarm(base)
    try:
        start_bootstrap(s)
        for role in ("learner", "sampler"):
            (base / f"{role}.toml").write_text(_config(role, str(data)))
        s.join("learner", "learner", "--config", str(base / "learner.toml"))
        s.join("honest", "sampler", "--config", str(base / "sampler.toml"), "--name", "honest")
        s.wait_version(2, timeout=240)
        s.data = str(data)
        yield s
    finally:
        s.stop_all()


def test_groups_that_cost_math_verify_seconds_are_dropped_within_their_budget(swarm, tmp_path):
    from swarm.p2p import SwarmNode

    ident = Identity.load_or_create(tmp_path / "attacker.key")
    node = SwarmNode(ident, NetworkConfig(initial_peers=[swarm.addr]), "demo")
    try:
        task, tok = DatasetTask(DatasetTaskConfig(train_files=(swarm.data,), chat_template="off", eval_fraction=0.1)), \
            load_tokenizer(BUILTIN_MODEL)
        problems = list(task.split("train"))

        def item(i: int, text: str) -> list:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            p = problems[i]
            g = RolloutGroup(id=uuid.uuid4().hex, swarm="demo", task=task.name, prompt_id=p.id, prompt=p.prompt,
                             model_id=BUILTIN_MODEL, tokenizer=tokenizer_hash(tok), version=0, sampler=ident.peer_id,
                             created=time.time(), completions=[CompletionRecord(text, ids, [-1.0] * len(ids), "length", 0.0)] * 8,
                             sampling={"temperature": 1.0})
            return [g.id, seal(ident, g.encode())]

        items = [item(i, TOWER) for i in range(4)] + [item(4 + i, EVADES) for i in range(2)]
        learner = peer_of(swarm, "learner")
        reply = msgpack.unpackb(node.call_gated(learner, ROLLOUTS, msgpack.packb(items), timeout=60), raw=False)
        assert sorted(reply["ok"]) == sorted(i[0] for i in items), reply  # every check before the ack passed
        before = swarm.version()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            steps = [r for r in swarm.metrics() if r["kind"] == "step"]
            if steps and steps[-1]["drops"].get("reward_budget", 0) >= len(items) and swarm.version() >= before + 2:
                break
            time.sleep(1.0)
        step = [r for r in swarm.metrics() if r["kind"] == "step"][-1]
        assert step["drops"].get("reward_budget", 0) == len(items), step["drops"]
        assert swarm.version() >= before + 2  # still training on the honest sampler's groups
        assert ident.peer_id not in step["accepted_by_sampler"]  # never trained on, never credited
        log = (swarm.logs / "learner.log").read_text()
        assert log.count("refused before scoring") == 4 and log.count("ran past its deadline") == 2, log[-3000:]
    finally:
        node.shutdown()
