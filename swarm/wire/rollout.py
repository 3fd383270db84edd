"""Wire records (docs/DESIGN.md, "Wire records"), msgpack-encoded, validated before anything else sees them.

A record is a msgpack map. Mandatory fields must be present with the right types; unknown extra
fields are tolerated within `MAX_UNKNOWN_BYTES` per record (newer peers may add a few small ones,
so old and new peers interoperate; a megabyte of padding is refused, not journaled). Numeric
arrays travel as raw little-endian bytes (uint32 token ids, float32 log-probs), not lists.

Decoding raises `RecordError` whose `reason` is a `Drop` (swarm/wire/reasons.py: undecodable, oversize,
schema, sizes, nonfinite, protocol, unknown_fields) for the receiver's drop counters.
This module knows bytes and records, never torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import msgpack
import numpy as np
from swarm.wire.reasons import Drop

PROTOCOL = 2
"""2: checkable sampling by a seeded race (node/sampling/race.py), audited by margin; 1 drew by the
inverse CDF, which another protocol's auditor would refuse as chosen tokens, so the versions do
not mix."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""One record must fit one hivemind RPC reply (4 MiB cap)."""
MAX_COMPLETIONS = 256
MAX_TOKENS = 32_768
MAX_TEXT = 256 * 1024
MAX_ID = 64
"""Record ids, peer ids, model ids, chain ids...: a learner keeps many of them (dedupe, counters),
so each is bounded in bytes."""
MAX_NAME = 256
"""Other short strings (swarm, task, prompt id, model id, tokenizer hash)."""
MAX_UNKNOWN_BYTES = 512
"""Unknown fields of one record (top level and every completion together), msgpack-encoded: room
for a newer peer's few small fields, not for padding a learner's journal with."""
MAX_SAMPLING_BYTES = 1024
"""The `sampling` map (a few settings), msgpack-encoded."""


class RecordError(ValueError):
    """A record (or a message) refused, with the reason it is counted as."""

    def __init__(self, reason: Drop, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass
class CompletionRecord:
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    reward: float
    """The sampler's claim; learners recompute it and never trust it."""


@dataclass
class RolloutGroup:
    id: str
    swarm: str
    task: str
    prompt_id: str
    prompt: str
    model_id: str
    tokenizer: str
    """Hash of the generating tokenizer's vocabulary: equal hashes mean shared token ids."""
    version: int
    """Policy version of the weights that generated every completion of the group."""
    sampler: str
    """Peer id of the sampler."""
    created: float
    completions: list[CompletionRecord]
    sampling: dict[str, Any] = field(default_factory=dict)
    chain: str = ""
    """The learner weight chain `version` belongs to ("" before any weights were loaded)."""
    protocol: int = PROTOCOL

    def encode(self) -> bytes:
        # shallow: asdict() would deep-copy every completion's token lists only to replace them
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["completions"] = [_encode_completion(c) for c in self.completions]
        data = msgpack.packb(d, use_bin_type=True)
        if len(data) > MAX_RECORD_BYTES:
            raise RecordError(Drop.OVERSIZE, f"{len(data)} bytes > {MAX_RECORD_BYTES}")
        return data


def _encode_completion(c: CompletionRecord) -> dict:
    return {
        "text": c.text,
        "token_ids": np.asarray(c.token_ids, dtype="<u4").tobytes(),
        "logprobs": np.asarray(c.logprobs, dtype="<f4").tobytes(),
        "finish_reason": c.finish_reason,
        "reward": float(c.reward),
    }


_GROUP_FIELDS: dict[str, type | tuple[type, ...]] = {
    "id": str, "swarm": str, "task": str, "prompt_id": str, "prompt": str, "model_id": str,
    "tokenizer": str, "version": int, "sampler": str, "created": (int, float), "completions": list,
}
_COMPLETION_FIELDS: dict[str, type | tuple[type, ...]] = {
    "text": str, "token_ids": bytes, "logprobs": bytes, "finish_reason": str, "reward": (int, float),
}
_GROUP_KNOWN = frozenset(_GROUP_FIELDS) | {"sampling", "chain", "protocol"}
_COMPLETION_KNOWN = frozenset(_COMPLETION_FIELDS)


def _packed_size(value: Any) -> int:
    try:
        return len(msgpack.packb(value, use_bin_type=True))
    except (ValueError, TypeError, OverflowError):  # nested deeper than msgpack packs: no field of ours
        return MAX_RECORD_BYTES


def unknown_bytes(d: dict, known: frozenset[str]) -> int:
    """Bytes of `d`'s fields outside `known`, as msgpack encodes them (0 without any: no encoding)."""
    extra = [k for k in d if k not in known]
    return _packed_size({k: d[k] for k in extra}) if extra else 0


def _check_unknown(d: dict) -> None:
    """Unknown fields of the whole record (its completions' included) within MAX_UNKNOWN_BYTES."""
    # a completion that is not a map fails its own check in _decode_completion
    n = unknown_bytes(d, _GROUP_KNOWN) + sum(unknown_bytes(c, _COMPLETION_KNOWN) for c in d["completions"]
                                             if isinstance(c, dict))
    if n > MAX_UNKNOWN_BYTES:
        raise RecordError(Drop.UNKNOWN_FIELDS, f"{n} bytes of unknown fields (at most {MAX_UNKNOWN_BYTES})")
    sampling = d.get("sampling", {})
    if isinstance(sampling, dict) and _packed_size(sampling) > MAX_SAMPLING_BYTES:
        raise RecordError(Drop.OVERSIZE, f"record sampling settings over {MAX_SAMPLING_BYTES} bytes")


def _check_fields(d: Any, spec: dict, what: str) -> None:
    if not isinstance(d, dict):
        raise RecordError(Drop.SCHEMA, f"{what} is {type(d).__name__}, not a map")
    for name, typ in spec.items():
        if name not in d:
            raise RecordError(Drop.SCHEMA, f"{what} lacks mandatory field {name!r}")
        if not isinstance(d[name], typ) or isinstance(d[name], bool):
            raise RecordError(Drop.SCHEMA, f"{what}.{name} is {type(d[name]).__name__}")


def _decode_completion(d: Any, i: int) -> CompletionRecord:
    _check_fields(d, _COMPLETION_FIELDS, f"completions[{i}]")
    tb, lb = d["token_ids"], d["logprobs"]
    if len(tb) % 4 or len(lb) % 4 or len(tb) != len(lb):
        raise RecordError(Drop.SIZES, f"completions[{i}]: {len(tb)} token bytes vs {len(lb)} log-prob bytes")
    if len(tb) // 4 > MAX_TOKENS or len(d["text"]) > MAX_TEXT:
        raise RecordError(Drop.OVERSIZE, f"completions[{i}] has {len(tb) // 4} tokens")
    logprobs = np.frombuffer(lb, dtype="<f4")
    if not np.isfinite(logprobs).all() or not math.isfinite(d["reward"]):
        raise RecordError(Drop.NONFINITE, f"completions[{i}] has a NaN/inf log-prob or reward")
    return CompletionRecord(d["text"], np.frombuffer(tb, dtype="<u4").tolist(), logprobs.tolist(),
                            d["finish_reason"], float(d["reward"]))


def _check_lengths(d: dict) -> None:
    for name in ("id", "sampler"):
        if not 0 < len(d[name]) <= MAX_ID:
            raise RecordError(Drop.OVERSIZE, f"record {name} of {len(d[name])} characters (1..{MAX_ID})")
    for name in ("swarm", "task", "prompt_id", "model_id", "tokenizer"):
        if len(d[name]) > MAX_NAME:
            raise RecordError(Drop.OVERSIZE, f"record {name} of {len(d[name])} characters (at most {MAX_NAME})")
    if len(d["prompt"]) > MAX_TEXT or len(str(d.get("chain", ""))) > MAX_ID:
        raise RecordError(Drop.OVERSIZE, "record prompt or chain too long")


def decode_rollout_group(data: bytes, strict: bool = True) -> RolloutGroup:
    """Bytes -> a structurally valid RolloutGroup, or RecordError with a reason code.

    `strict=False` skips the bound on unknown fields, for records accepted before it existed
    (a checkpoint's buffer): refusing them on a restart would stop the learner, not the attack."""
    if not isinstance(data, (bytes, bytearray)):
        raise RecordError(Drop.SCHEMA, f"record is {type(data).__name__}, not bytes")
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(Drop.OVERSIZE, f"{len(data)} bytes > {MAX_RECORD_BYTES}")
    try:
        d = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several types for garbage
        raise RecordError(Drop.UNDECODABLE, f"{type(e).__name__}: {e}") from None
    _check_fields(d, _GROUP_FIELDS, "record")
    _check_lengths(d)
    if d.get("protocol", PROTOCOL) != PROTOCOL:
        raise RecordError(Drop.PROTOCOL, f"protocol {d.get('protocol')!r}, this node speaks {PROTOCOL}")
    if not 1 <= len(d["completions"]) <= MAX_COMPLETIONS:
        raise RecordError(Drop.SIZES, f"{len(d['completions'])} completions (1..{MAX_COMPLETIONS})")
    if strict:
        _check_unknown(d)
    if d["version"] < 0:
        raise RecordError(Drop.SCHEMA, f"negative version {d['version']}")
    sampling = d.get("sampling", {})
    chain = d.get("chain", "")
    return RolloutGroup(
        id=d["id"], swarm=d["swarm"], task=d["task"], prompt_id=d["prompt_id"], prompt=d["prompt"],
        model_id=d["model_id"], tokenizer=d["tokenizer"], version=d["version"], sampler=d["sampler"],
        created=float(d["created"]), sampling=sampling if isinstance(sampling, dict) else {},
        chain=chain if isinstance(chain, str) else "",
        completions=[_decode_completion(c, i) for i, c in enumerate(d["completions"])],
    )
