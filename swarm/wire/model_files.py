"""hetero.model.v1: what a sampler needs to run the model a learner trains, besides the weights
(its config, generation config and tokenizer files, and the swarm's task and sampling tables),
packed in one content-addressed bundle the learner serves in parts (learner -> any sampler).

    FilesRequest  {"digest": the bundle's sha256 (hex), "part": its index}
    FilesReply    {"data": that part's bytes, "parts": how many there are [, "error": busy, not held, malformed]}

The bundle's digest and size are in the learner's signed peer record (`PeerInfo.files`,
`files_bytes`), so a sampler checks every byte it assembled against what the learner signed,
whoever served the parts; the weights come as the learner's keyframe, checked against its
manifest the same way. So a volunteer needs neither a model flag nor hub access, and a learner of a
local checkpoint can be joined. A bundle is at most `MAX_BUNDLE` bytes packed and `MAX_UNPACKED`
unpacked (a zip bomb stops there), and holds only files named in `FILE_NAMES`: nothing a sampler
unpacks can escape its folder or run code (no `.py`: remote code is never trusted).
"""

from __future__ import annotations

import hashlib
import re
import zlib
from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from swarm.wire import MAX_MESSAGE, decode_message

MODEL_FILES = "hetero.model.v1"

PART = 1024 * 1024
"""Bytes of one part (a reply stays well under MAX_MESSAGE)."""
MAX_BUNDLE = 64 * 1024 * 1024
"""Bytes of a packed bundle at most: a Qwen3 tokenizer and config pack to ~2.4 MB (its tokenizer.json
is 11 MB of JSON); the largest hub tokenizers (a 256k SentencePiece vocabulary) are ~35 MB unpacked."""
MAX_UNPACKED = 128 * 1024 * 1024
"""Bytes of a bundle's files together once unpacked: what inflating a peer's bytes may allocate."""
MAX_PARTS = MAX_BUNDLE // PART
FILE_NAMES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json",
})
"""The files a bundle may hold: what `AutoConfig`, `GenerationConfig` and `AutoTokenizer` read from a
model folder, and no code."""
DIGEST = re.compile(r"[0-9a-f]{64}")

Digest = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]


class ModelFiles(Struct, forbid_unknown_fields=True, gc=False):
    """A bundle's contents: the model's files, and what the learner trains it on."""

    model_id: Annotated[str, Meta(max_length=256)]
    """The name the learner trains it under (its --model): what samplers put in their records."""
    files: dict[str, bytes]
    task: dict = {}
    """The learner's [task] table (node/tasks: its config as a dict)."""
    sampling: dict = {}
    """The learner's [sampling] table: the learner refuses rollouts drawn with other settings."""

    def pack(self) -> bytes:
        return zlib.compress(msgspec.msgpack.encode(self), 6)

    @classmethod
    def unpack(cls, blob: bytes) -> ModelFiles:
        """The bundle in `blob`; ValueError if it is not one within the bounds (nothing else escapes)."""
        if len(blob) > MAX_BUNDLE:
            raise ValueError(f"a bundle of {len(blob)} bytes (at most {MAX_BUNDLE})")
        inflate = zlib.decompressobj()
        try:
            raw = inflate.decompress(blob, MAX_UNPACKED)
        except zlib.error as e:
            raise ValueError(f"not a bundle: {e}") from None
        if inflate.unconsumed_tail or not inflate.eof:
            raise ValueError(f"a bundle past {MAX_UNPACKED} bytes unpacked, or cut short")
        bundle = decode_message(_BUNDLE, raw, MAX_UNPACKED, "a model bundle")
        unknown = sorted(set(bundle.files) - FILE_NAMES)
        if unknown:
            raise ValueError(f"a bundle with files no model folder needs: {unknown[:4]}")
        if "config.json" not in bundle.files:
            raise ValueError("a bundle without config.json")
        return bundle


def digest(blob: bytes) -> str:
    return hashlib.sha256(blob).hexdigest()


def parts(nbytes: int) -> int:
    """How many parts a bundle of `nbytes` is served in."""
    return max(1, -(-nbytes // PART))


class FilesRequest(Struct, array_like=True, forbid_unknown_fields=True, gc=False):
    digest: Digest
    part: Annotated[int, Meta(ge=0, lt=MAX_PARTS)]

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> FilesRequest:
        return decode_message(_REQUEST, data, 256, "a model files request")


class FilesReply(Struct, forbid_unknown_fields=True, gc=False):
    data: Annotated[bytes, Meta(max_length=PART)] = b""
    parts: Annotated[int, Meta(ge=0, le=MAX_PARTS)] = 0
    error: Literal["busy", "not held", "malformed"] | UnsetType = UNSET

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> FilesReply:
        return decode_message(_REPLY, data, MAX_MESSAGE, "a model files reply")


_BUNDLE = msgspec.msgpack.Decoder(ModelFiles)
_REQUEST = msgspec.msgpack.Decoder(FilesRequest)
_REPLY = msgspec.msgpack.Decoder(FilesReply)
