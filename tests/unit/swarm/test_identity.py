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


def test_key_messages_are_byte_for_byte_libp2ps_and_an_old_identity_file_loads(tmp_path):
    import random

    from hivemind.proto import crypto_pb2

    from swarm.identity import RSA_KEY, key_proto, parse_key_proto

    rng = random.Random(0)
    # by hand: type 0 (08 00), data of 3 bytes (12 03 ...); a 300-byte key's length takes two varint bytes (ac 02)
    assert key_proto(RSA_KEY, b"abc") == bytes.fromhex("08001203616263")
    assert key_proto(RSA_KEY, b"x" * 300)[:5] == bytes.fromhex("080012ac02")
    for n in (0, 1, 127, 128, 294, 1192, 20000):
        data = rng.randbytes(n)
        ours = key_proto(RSA_KEY, data)
        assert ours == crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=data).SerializeToString()
        assert ours == crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA, data=data).SerializeToString()
        assert parse_key_proto(ours) == (RSA_KEY, data)
    # fields in another order, and an Ed25519 key type, as protobuf reads them
    swapped = b"\x12\x02hi\x08\x01"
    assert parse_key_proto(swapped) == (crypto_pb2.PrivateKey.FromString(swapped).key_type, b"hi") == (1, b"hi")
    for bad in (b"\x08\x00", b"\x12\x05ab", b"\x08\x80", b"\x0d\x00\x00\x00\x00"):  # no data, cut short, broken varint, fixed32
        with pytest.raises(ValueError):
            parse_key_proto(bad)
    # an identity file hivemind's crypto_pb2 wrote (every workdir made before this code) loads as the same peer
    fresh = Identity.load_or_create(tmp_path / "new.key")
    old = tmp_path / "old.key"
    old.write_bytes(crypto_pb2.PrivateKey(key_type=crypto_pb2.RSA,
                                          data=parse_key_proto((tmp_path / "new.key").read_bytes())[1]).SerializeToString())
    assert Identity.load_or_create(old).peer_id == fresh.peer_id


def test_the_identity_module_does_not_load_hivemind():
    import subprocess
    import sys

    # the demo makes its learner's key before it starts a process: hivemind (and torch) would cost it ~2 s
    code = "import sys, swarm.identity; print('hivemind' in sys.modules, 'torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split() == ["False", "False"]
