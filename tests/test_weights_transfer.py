"""Versions over real hivemind RPC between two in-process peers: exact deltas, forged manifests and
corrupted chunks refused."""

import msgpack
import pytest
import torch

from node.models import BUILTIN_MODEL, load_model
from node.weight_codec import CodecConfig, Publisher, apply_version
from node.weights import decode_version, encode_version, untie
from swarm.dht import NetworkConfig
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.journal import Journal
from swarm.outbox import Outbox
from swarm.p2p import SwarmNode
from swarm.swarm_exchange import LearnerExchange, SamplerExchange

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wt")
    learner_node = SwarmNode(Identity.load_or_create(tmp / "l.key"), NetworkConfig(), "wt")
    sampler_node = SwarmNode(Identity.load_or_create(tmp / "s.key"), NetworkConfig(initial_peers=learner_node.maddrs()), "wt")
    lx = LearnerExchange(learner_node, Journal(tmp / "journal.bin"))
    sx = SamplerExchange(sampler_node, Outbox(tmp / "outbox.db"), lambda: learner_node.peer_id)
    yield lx, sx
    sx.close()
    sampler_node.shutdown()
    learner_node.shutdown()


def publish_versions(lx, n, chain="run1"):
    weights, aliases = untie(load_model(BUILTIN_MODEL).state_dict())
    pub = Publisher(CodecConfig(codec="int8", keyframe_every=100))
    gen = torch.Generator().manual_seed(0)
    for v in range(n):
        weights = {k: t + 1e-3 * torch.randn(t.shape, generator=gen) for k, t in weights.items()}
        lx.publish_weights("l", v, encode_version(pub.publish(weights, v), BUILTIN_MODEL, chain, aliases))
    return pub


def apply_all(published, blobs):
    for blob in blobs:
        enc, _ = decode_version(blob)
        published = apply_version(published if enc.base is not None else None, enc)
    return published


def test_keyframe_then_deltas_over_rpc_reconstruct_bit_exactly(peers):
    lx, sx = peers
    pub = publish_versions(lx, 4)
    blobs = sx.fetch_weights("s", "", -1)  # nothing yet: the keyframe and every delta
    assert [decode_version(b)[0].version for b in blobs] == [0, 1, 2, 3]
    got = apply_all(None, blobs)
    assert all(torch.equal(got[k], pub.published[k]) for k in got)
    # one more version: only the new delta travels
    weights = {k: t + 1e-3 for k, t in pub.published.items()}
    lx.publish_weights("l", 4, encode_version(pub.publish(weights, 4), BUILTIN_MODEL, "run1", {}))
    newer = sx.fetch_weights("s", "run1", 3)
    assert [decode_version(b)[0].version for b in newer] == [4]
    assert all(torch.equal(apply_all(got, newer)[k], pub.published[k]) for k in got)


def test_a_manifest_not_signed_by_the_followed_learner_is_refused(peers, tmp_path):
    lx, sx = peers
    publish_versions(lx, 2)
    forger = Identity.load_or_create(tmp_path / "forger.key")
    lx._manifest = seal(forger, msgpack.packb({"model_id": BUILTIN_MODEL, "chain": "evil", "versions": [],
                                               "learner": sx.learner(), "chunk_size": 1}))
    before = sx.stats["forged_manifests"]
    assert sx.fetch_weights("s", "", -1) is None
    assert sx.stats["forged_manifests"] == before + 1


def test_a_corrupted_chunk_is_detected_and_never_applied(peers):
    lx, sx = peers
    publish_versions(lx, 1, chain="run2")
    blob = bytearray(lx._weights[0])
    blob[len(blob) // 2] ^= 0xFF  # the learner's copy is damaged after the manifest was made
    lx._weights[0] = bytes(blob)
    before = sx.stats["bad_chunks"]
    assert sx.fetch_weights("s", "", -1) is None
    assert sx.stats["bad_chunks"] == before + 3  # three attempts, each refused by its hash
