"""Which learner's model a sampler given no model runs (swarm/discovery.py `swarm_model`)."""

from __future__ import annotations

from swarm.discovery import swarm_model
from swarm.wire.peer import PeerInfo, SwarmRecord

DIGEST = "ab" * 32


def learner(pid: str, model: str, files: str = DIGEST) -> PeerInfo:
    return PeerInfo(peer_id=pid, role="learner", model_id=model, version=0, engine="hf", throughput=0.0, files=files)


def record(learners: dict[str, str], model_id: str = "") -> SwarmRecord:
    return SwarmRecord(coordinator="c", learners=sorted(learners), model_id=model_id,
                       models={k: v for k, v in learners.items() if v})


def test_the_learner_of_the_model_the_swarm_record_names() -> None:
    peers = [learner("L1", "a"), learner("L2", "b")]
    assert swarm_model([record({"L1": "a", "L2": "b"}, "b")], peers).peer_id == "L2"
    assert swarm_model([record({"L1": "a", "L2": "b"})], peers).peer_id == "L1"  # none named: the first by id


def test_never_an_unnamed_learner_one_the_record_contradicts_or_one_without_files() -> None:
    assert swarm_model([record({"L1": "a"})], [learner("X", "a")]) is None
    assert swarm_model([record({"L1": "a"})], [learner("L1", "b")]) is None
    assert swarm_model([record({"L1": ""})], [learner("L1", "a", files="")]) is None


def test_a_pinned_learner_is_run_whoever_names_it() -> None:
    assert swarm_model([], [learner("P", "z")], pin="P").peer_id == "P"
