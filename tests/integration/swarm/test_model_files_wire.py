"""The learner's model bundle over the real protocol (hetero.model.v1, real hivemind peers in this
process): a sampler takes it whole and checked; a stranger with its own key is refused and counted
for malformed asks, asks for what the learner does not hold, and a flood past the door."""

from __future__ import annotations

import os

import pytest

from swarm.dht.network import NetworkConfig
from swarm.identity import Identity
from swarm.model_files import FilesServer, fetch_bundle
from swarm.p2p import SwarmNode
from swarm.wire.model_files import MODEL_FILES, FilesReply, FilesRequest, ModelFiles

SWARM = "files"


@pytest.fixture
def nodes(tmp_path):
    made = []
    try:
        learner = SwarmNode(Identity.load_or_create(tmp_path / "learner.key"), NetworkConfig(host="127.0.0.1"), SWARM)
        made.append(learner)
        join = NetworkConfig(initial_peers=learner.maddrs()[:1])
        for name in ("sampler", "stranger"):
            made.append(SwarmNode(Identity.load_or_create(tmp_path / f"{name}.key"), join, SWARM))
        # 3 MiB of incompressible tokenizer: 3 parts and more, as a real vocabulary's bundle is
        bundle = ModelFiles(model_id="m", files={"config.json": b"{}", "tokenizer.json": os.urandom(3 << 20)})
        yield FilesServer(learner, bundle), *made
    finally:
        for node in reversed(made):
            node.shutdown()


@pytest.mark.timeout(180)
def test_a_sampler_takes_the_bundle_whole_and_a_stranger_is_refused_and_counted(nodes):
    server, learner, sampler, stranger = nodes
    blob = fetch_bundle(lambda p: sampler.call(learner.peer_id, MODEL_FILES, p, 30), server.digest, server.nbytes)
    assert blob == server.blob and ModelFiles.unpack(blob).model_id == "m"

    ask = lambda payload: FilesReply.decode(stranger.call(learner.peer_id, MODEL_FILES, payload, 30))  # noqa: E731
    assert ask(b"\xc1garbage").error == "malformed"
    assert ask(FilesRequest(digest="0" * 64, part=0).encode()).error == "not held"
    assert ask(FilesRequest(digest=server.digest, part=60).encode()).error == "not held"
    assert server.stats["malformed"] == 1 and server.stats["not_held"] == 2

    # the stranger asks the whole bundle again and again: past its byte burst (one bundle at most)
    # and 8 MiB/s after, the door answers busy, counted by door and bound
    replies = [ask(FilesRequest(digest=server.digest, part=i % 4).encode()) for i in range(100)]
    busy = sum(r.error == "busy" for r in replies)
    refused = learner.doors.stats()[MODEL_FILES]
    assert busy > 0 and server.stats["busy"] == busy
    assert sum(v for k, v in refused.items() if k not in ("served_bytes", "tarpitted")) == busy
