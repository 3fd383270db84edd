"""Reading a weights blob's header (safetensors JSON metadata) from bytes alone, without torch."""

from __future__ import annotations

import json
import struct


def weights_metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's __metadata__ (model id, version, codec, aliases)."""
    if len(blob) < 8:
        raise ValueError("weights blob too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError("weights blob header is truncated")
    return json.loads(blob[8 : 8 + n]).get("__metadata__", {})


def plan_fetch(available: list[tuple[int, dict[str, str]]], have_chain: str, have_version: int) -> list[int]:
    """Versions a sampler must fetch, in order, from `available` = [(version, metadata)] of the
    learner's current chain (its last keyframe and the deltas after it, oldest first).

    Same chain and a version at or after the keyframe: only the newer deltas. Otherwise (a new
    learner, a restart, or too far behind): the keyframe and every delta after it.
    """
    if not available:
        return []
    key_version, key_meta = available[0]
    if have_chain == key_meta.get("chain") and have_version >= key_version:
        return [v for v, _ in available if v > have_version]
    return [v for v, _ in available]
