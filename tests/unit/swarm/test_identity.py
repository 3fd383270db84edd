"""A peer's identity (swarm/identity.py) is libp2p's, stable across loads, and its envelopes
(swarm/wire/envelope.py) bind the signer: an edited or undecodable one is refused with its reason.
The same records between real peers: tests/integration/swarm/test_swarm.py."""

from __future__ import annotations

import msgpack
import pytest

from swarm.identity import Identity
from swarm.wire.envelope import open_envelope, seal
from swarm.wire.rollout import RecordError


def test_identity_matches_libp2p_and_envelopes_bind_signer(tmp_path):
    from hivemind.p2p import PeerID

    a = Identity.load_or_create(tmp_path / "a.key")
    assert PeerID.from_identity((tmp_path / "a.key").read_bytes()).to_base58() == a.peer_id
    assert Identity.load_or_create(tmp_path / "a.key").peer_id == a.peer_id  # stable
    record, signer = open_envelope(seal(a, b"payload"))
    assert (record, signer) == (b"payload", a.peer_id)
    env = msgpack.unpackb(seal(a, b"payload"))
    env["r"] = b"payloaD"
    with pytest.raises(RecordError) as e:
        open_envelope(msgpack.packb(env))
    assert e.value.reason == "signature"
    with pytest.raises(RecordError) as e:
        open_envelope(b"\x93\x01")
    assert e.value.reason == "undecodable"
