"""The model bundle (swarm/wire/model_files.py) on the swarm: a learner serves its own, a sampler
that was given no model fetches it from the learner it follows and checks it against the digest in
that learner's signed peer record.

A fetch is a handful of unary calls (a Qwen3 bundle is 3 parts), made once when a sampler first
joins: the folder it writes (`<workdir>/swarm-model/<digest>/`) is reused on the next start while
the learner's digest is the same.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from msgspec import UNSET

from swarm.buckets import worth_logging
from swarm.identity import short_id
from swarm.wire.peer import PeerInfo
from swarm.wire.model_files import MODEL_FILES, PART, FilesReply, FilesRequest, ModelFiles, digest, parts

log = logging.getLogger(__name__)

CALL_S = 30.0
"""One part's call at most: 1 MiB at the slowest line we plan for (10 Mbit/s) takes under a second."""
BUSY_S = 1.0
"""How long a fetcher waits after a busy answer before it asks again (the door's tarpit has held it
about as long already)."""


class FilesServer:
    """A learner's bundle, served part by part behind its door (DOORS[MODEL_FILES])."""

    def __init__(self, node, bundle: ModelFiles) -> None:
        self.blob = bundle.pack()
        self.digest, self.nbytes = digest(self.blob), len(self.blob)
        self.stats = {"served_parts": 0, "busy": 0, "not_held": 0, "malformed": 0}
        self._door = node.doors.open(MODEL_FILES)
        node.add_handler(MODEL_FILES, self.on_call)

    async def on_call(self, payload: bytes, remote: str) -> bytes:
        past = self._door.enter(remote)
        if past is not None:
            self.stats["busy"] += 1
            await self._door.tarpit(remote, past)
            return FilesReply(error="busy").encode()
        reply = self.serve(payload, remote)
        self._door.charge(remote, len(payload) + len(reply))
        return reply

    def serve(self, payload: bytes, remote: str) -> bytes:
        try:
            request = FilesRequest.decode(payload)
        except ValueError as e:
            self.stats["malformed"] += 1
            if worth_logging(self.stats["malformed"]):
                log.info("malformed model files request from %s: %s", short_id(remote), e)
            return FilesReply(error="malformed").encode()
        n = parts(self.nbytes)
        if request.digest != self.digest or request.part >= n:
            self.stats["not_held"] += 1
            return FilesReply(error="not held").encode()
        self.stats["served_parts"] += 1
        return FilesReply(data=self.blob[request.part * PART:(request.part + 1) * PART], parts=n).encode()


class FetchFailed(Exception):
    """The learner did not give the bundle its record names (the message says why)."""


def fetch_bundle(call: Callable[[bytes], bytes], want: str, nbytes: int, stop: threading.Event | None = None,
                 deadline_s: float = 300.0) -> bytes:
    """The packed bundle of digest `want` and `nbytes` bytes, asked part by part through `call` (the
    learner's MODEL_FILES), checked whole against `want`. FetchFailed if it cannot be had."""
    n, got = parts(nbytes), []
    deadline = time.monotonic() + deadline_s
    while len(got) < n:
        if (stop is not None and stop.is_set()) or time.monotonic() > deadline:
            raise FetchFailed("stopped" if stop is not None and stop.is_set() else f"no bundle within {deadline_s:.0f} s")
        try:
            reply = FilesReply.decode(call(FilesRequest(digest=want, part=len(got)).encode()))
        except Exception as e:  # unreachable, timed out, or not a reply: asked again, within the deadline
            log.debug("model files part %d: %s: %s", len(got), type(e).__name__, e)
            (stop or threading.Event()).wait(BUSY_S)
            continue
        if reply.error == "busy":
            (stop or threading.Event()).wait(BUSY_S)
            continue
        if reply.error is not UNSET or reply.parts != n:
            raise FetchFailed(f"the learner answered {reply.error or f'{reply.parts} parts, not {n}'}")
        got.append(reply.data)
    blob = b"".join(got)
    if len(blob) != nbytes or digest(blob) != want:
        raise FetchFailed(f"the bundle's {len(blob)} bytes are not the {nbytes} its record names (digest differs)")
    return blob


def fetch_from(node, learner: PeerInfo, stop: threading.Event | None = None, deadline_s: float = 300.0) -> bytes:
    """`fetch_bundle` of the bundle `learner`'s signed peer record names, asked of that learner."""
    return fetch_bundle(lambda payload: node.call(learner.peer_id, MODEL_FILES, payload, CALL_S, stop), learner.files,
                        learner.files_bytes, stop, deadline_s)


def unpack_to(blob: bytes, folder: Path) -> ModelFiles:
    """Write the bundle's files into `folder` (replaced whole: written beside it, then renamed), and
    the blob itself as `bundle.bin`, so the next start finds it without asking."""
    bundle = ModelFiles.unpack(blob)
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for name, data in bundle.files.items():  # names are FILE_NAMES only: plain names, no path
        (part / name).write_bytes(data)
    (part / "bundle.bin").write_bytes(blob)
    shutil.rmtree(folder, ignore_errors=True)
    part.rename(folder)
    return bundle


def held(folder: Path, want: str) -> ModelFiles | None:
    """The bundle already unpacked in `folder`, if its blob is the one of digest `want`."""
    try:
        blob = (folder / "bundle.bin").read_bytes()
        return ModelFiles.unpack(blob) if digest(blob) == want else None
    except (OSError, ValueError):
        return None
