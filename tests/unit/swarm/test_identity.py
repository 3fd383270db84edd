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


def test_a_peer_id_is_base58_of_a_sha256_or_identity_multihash(tmp_path):
    from swarm.identity import PeerIdError, check_peer_id, is_peer_id

    ours = Identity.load_or_create(tmp_path / "a.key").peer_id  # RSA: sha2-256, Qm...
    ed25519 = "12D3KooWD3eckifWpRn9wQpMG9R9hX3sD158z7EqHWmweQAJU5SA"  # a key inlined (identity multihash)
    assert is_peer_id(ours) and is_peer_id(ed25519) and check_peer_id(ours, "--follow") == ours
    for typo in ("", "Qm-typo", "Qmabc", ours[:-1], ours + "x", "12D3KooWabc", "5dsTkoid8BfXLjnQaCCAQdGBVhTgT9",
                 "é" * 10, ours.lower()):  # the last but two: a sha1 multihash, not a libp2p id
        assert not is_peer_id(typo), typo
    with pytest.raises(PeerIdError, match="--follow: 'Qm-typo' is not a peer id") as e:
        check_peer_id("Qm-typo", "--follow")
    assert "hetero-node peer-id" in e.value.fix
