"""The model bundle (swarm/wire/model_files.py, swarm/model_files.py): what a sampler given no model
takes from its learner, and what it refuses."""

from __future__ import annotations

import zlib

import msgspec
import pytest

from swarm.model_files import FetchFailed, fetch_bundle, held, unpack_to
from swarm.wire.model_files import (MAX_UNPACKED, PART, FilesReply, FilesRequest, ModelFiles, digest, parts)


def bundle(size: int = 10) -> ModelFiles:
    return ModelFiles(model_id="m", files={"config.json": b"{}", "tokenizer.json": b"t" * size},
                      task={"kind": "arithmetic"}, sampling={"group_size": 4})


def test_a_bundle_round_trips_and_its_digest_is_the_sha256_of_its_bytes() -> None:
    blob = bundle().pack()
    assert ModelFiles.unpack(blob) == bundle()
    assert digest(blob) == __import__("hashlib").sha256(blob).hexdigest()


def test_parts_are_the_ceiling_of_bytes_over_a_part() -> None:
    assert [parts(n) for n in (0, 1, PART, PART + 1, 3 * PART)] == [1, 1, 1, 2, 3]


@pytest.mark.parametrize("files", [{"config.json": b"{}", "model.py": b"import os"},
                                   {"config.json": b"{}", "../config.json": b"{}"},
                                   {"tokenizer.json": b"{}"}])
def test_a_bundle_with_code_a_path_or_no_config_is_refused(files) -> None:
    with pytest.raises(ValueError):
        ModelFiles.unpack(ModelFiles(model_id="m", files=files).pack())


def test_a_bundle_that_inflates_past_its_bound_is_refused_before_it_is_held_whole() -> None:
    bomb = zlib.compress(b"\0" * (MAX_UNPACKED + 1), 9)  # ~130 KB that would unpack to 128 MiB + 1
    with pytest.raises(ValueError, match="past"):
        ModelFiles.unpack(bomb)
    with pytest.raises(ValueError):
        ModelFiles.unpack(b"not zlib")


def test_requests_outside_their_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        FilesRequest.decode(msgspec.msgpack.encode(["ab" * 32 + "g", 0]))  # not hex
    with pytest.raises(ValueError):
        FilesRequest.decode(msgspec.msgpack.encode(["ab" * 32, 10**6]))  # past MAX_PARTS
    assert FilesRequest.decode(FilesRequest(digest="ab" * 32, part=2).encode()).part == 2


class Server:
    """The learner's side of `fetch_bundle`'s calls: its parts, after `busy` busy answers."""

    def __init__(self, blob: bytes, busy: int = 0) -> None:
        self.blob, self.busy, self.calls = blob, busy, 0

    def __call__(self, payload: bytes) -> bytes:
        self.calls += 1
        if self.busy:
            self.busy -= 1
            return FilesReply(error="busy").encode()
        req = FilesRequest.decode(payload)
        data = self.blob[req.part * PART:(req.part + 1) * PART]
        return FilesReply(data=data, parts=parts(len(self.blob))).encode()


def test_a_fetch_assembles_the_parts_and_waits_out_a_busy_door(monkeypatch) -> None:
    monkeypatch.setattr("swarm.model_files.BUSY_S", 0.0)
    import os

    blob = ModelFiles(model_id="m", files={"config.json": b"{}", "tokenizer.json": os.urandom(2 * PART)}).pack()
    server = Server(blob, busy=2)
    assert fetch_bundle(server, digest(blob), len(blob)) == blob
    assert server.calls == 2 + parts(len(blob)) == 5


def test_a_fetch_whose_bytes_are_not_the_signed_digest_fails() -> None:
    blob = bundle().pack()
    with pytest.raises(FetchFailed, match="digest"):
        fetch_bundle(Server(bundle(11).pack()), digest(blob), len(blob))


def test_a_bundle_unpacks_to_a_folder_and_is_found_there_again(tmp_path) -> None:
    blob = bundle().pack()
    folder = tmp_path / "swarm-model" / digest(blob)[:16]
    unpack_to(blob, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["bundle.bin", "config.json", "tokenizer.json"]
    assert held(folder, digest(blob)) == bundle()
    assert held(folder, "0" * 64) is None  # another digest: fetched again
