"""Weights as bytes for the exchange: one encoded version (keyframe or patch) in safetensors format.

Two uint8 tensors, `positions` and `values` (node/weights/codec.py), and header metadata: model id,
version, base (empty for a keyframe), the view's dtype, the layout (tensor names and shapes in
order), counts and byte planes, the view's digest, the learner's chain id (one per learner start:
a patch only applies to weights of the same chain) and tied-tensor aliases. Tied tensors
(input/output embeddings) travel once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct

import torch
from safetensors.torch import save as st_save

from node.sampling.race import SEED_BYTES
from node.weights.codec import VIEWS, EncodedVersion, Layout


def untie(state_dict: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors with each storage once, {alias: name it shares storage with})."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in seen:
            aliases[name] = seen[key]
        else:
            seen[key] = name
            unique[name] = t
    return unique, aliases


def retie(tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    return {**tensors, **{alias: tensors[target] for alias, target in aliases.items()}}


def _u8(b: bytes) -> torch.Tensor:
    # frombuffer refuses an empty buffer; bytearray: a writable copy, as torch wants
    return torch.frombuffer(bytearray(b), dtype=torch.uint8) if b else torch.zeros(0, dtype=torch.uint8)


def encode_version(enc: EncodedVersion, model_id: str, chain: str, aliases: dict[str, str]) -> bytes:
    tensors = {"positions": _u8(enc.positions), "values": _u8(enc.values)}
    meta = {"model_id": model_id, "version": str(enc.version), "base": "" if enc.base is None else str(enc.base),
            "view": enc.view, "chain": chain, "aliases": json.dumps(aliases), "count": str(enc.count),
            "position_planes": str(enc.position_planes), "value_planes": str(enc.value_planes), "digest": enc.digest,
            "layout": json.dumps([[n, list(s)] for n, s in zip(enc.layout.names, enc.layout.shapes)])}
    return st_save(tensors, metadata=meta)


def _safetensors_header(blob: bytes) -> tuple[dict, int]:
    """(the safetensors header, where the tensor data starts), from the bytes alone."""
    if len(blob) < 8:
        raise ValueError("weights blob too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError("weights blob header is truncated")
    try:
        header = json.loads(memoryview(blob)[8 : 8 + n].tobytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"weights blob header is not JSON: {e}") from e
    if not isinstance(header, dict):
        raise ValueError("weights blob header is not a table")
    return header, 8 + n


def _header(blob: bytes) -> tuple[dict[str, str], int]:
    """(the safetensors header's __metadata__, where the tensor data starts), from the bytes alone."""
    header, data = _safetensors_header(blob)
    return header.get("__metadata__", {}), data


def _byte_tensors(blob: bytes) -> dict[str, memoryview]:
    """The blob's uint8 tensors as views of it, not copies: a keyframe is ~1.4 bytes a parameter
    (a 0.6B one 0.8 GB), and a learner archives, and a sampler decodes, the blob it also serves.
    safetensors' own readers of bytes copy every tensor out."""
    header, start = _safetensors_header(blob)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            lo, hi = (int(x) for x in info["data_offsets"])
            ok = info["dtype"] == "U8" and list(info["shape"]) == [hi - lo] and 0 <= lo <= hi <= len(blob) - start
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"weights blob: tensor {name!r} is not a uint8 run inside the blob")
        out[name] = memoryview(blob)[start + lo : start + hi]
    return out


def weights_metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's __metadata__ of an encoded version, read from the bytes alone."""
    return _header(blob)[0]


def version_nonce(blob: bytes) -> bytes:
    """The nonce of a published version (node/sampling/race.py): a hash of its metadata, in sorted order
    (safetensors writes the keys in an order that varies from save to save, and a nonce must be a
    function of the content for runs to be reproducible), and of its tensor data."""
    meta, data = _header(blob)
    h = hashlib.blake2b(json.dumps(meta, sort_keys=True).encode(), digest_size=SEED_BYTES)
    h.update(memoryview(blob)[data:])
    return h.digest()


def in_blob(enc: EncodedVersion, blob: bytes) -> EncodedVersion:
    """`enc` with its byte planes as views of `blob`, its encoding (`encode_version`): what a learner
    archives of a version it publishes, so the archive and the chunk server share one copy."""
    tensors = _byte_tensors(blob)
    return dataclasses.replace(enc, positions=tensors["positions"], values=tensors["values"])


def decode_version(blob: bytes) -> tuple[EncodedVersion, dict[str, str]]:
    """(the encoded version, tied-tensor aliases); ValueError on a blob that is not one."""
    meta = weights_metadata(blob)
    try:
        tensors = _byte_tensors(blob)
        layout = json.loads(meta["layout"])
        enc = EncodedVersion(int(meta["version"]), int(meta["base"]) if meta["base"] else None, meta["view"],
                             Layout(tuple(str(n) for n, _ in layout), tuple(tuple(int(d) for d in s) for _, s in layout)),
                             int(meta["count"]), tensors["positions"], int(meta["position_planes"]),
                             tensors["values"], int(meta["value_planes"]), meta["digest"])
        aliases = json.loads(meta.get("aliases", "{}"))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"not an encoded weights version: {type(e).__name__}: {e}") from e
    if enc.view not in VIEWS:
        raise ValueError(f"unknown view dtype {enc.view!r}")
    return enc, aliases
