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


def weights_model_id(blob: bytes) -> str:
    return weights_metadata(blob).get("model_id", "")
