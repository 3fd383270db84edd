"""Weights as bytes for the exchange: one encoded version (keyframe or delta) in safetensors format.

The header metadata carries model id, version, base (empty for a keyframe), codec, block size,
tensor shapes, the learner's chain id (one per learner start: a delta only applies to weights of
the same chain) and tied-tensor aliases. Tied tensors (input/output embeddings) travel once.
"""

from __future__ import annotations

import hashlib
import json
import struct

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from .checkable import SEED_BYTES
from .weight_codec import EncodedVersion


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


def encode_version(enc: EncodedVersion, model_id: str, chain: str, aliases: dict[str, str]) -> bytes:
    flat = {f"{name}::{part}": t.contiguous() for name, parts in enc.tensors.items() for part, t in parts.items()}
    meta = {"model_id": model_id, "version": str(enc.version), "base": "" if enc.base is None else str(enc.base),
            "codec": enc.codec, "block": str(enc.block), "chain": chain, "aliases": json.dumps(aliases),
            "shapes": json.dumps({k: list(v) for k, v in enc.shapes.items()})}
    return st_save(flat, metadata=meta)


def _header(blob: bytes) -> tuple[dict[str, str], int]:
    """(the safetensors header's __metadata__, where the tensor data starts), from the bytes alone."""
    if len(blob) < 8:
        raise ValueError("weights blob too short")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError("weights blob header is truncated")
    return json.loads(blob[8 : 8 + n]).get("__metadata__", {}), 8 + n


def weights_metadata(blob: bytes) -> dict[str, str]:
    """The safetensors header's __metadata__ of an encoded version, read from the bytes alone."""
    return _header(blob)[0]


def version_nonce(blob: bytes) -> bytes:
    """The nonce of a published version (node/checkable.py): a hash of its metadata, in sorted order
    (safetensors writes the keys in an order that varies from save to save, and a nonce must be a
    function of the content for runs to be reproducible), and of its tensor data."""
    meta, data = _header(blob)
    h = hashlib.blake2b(json.dumps(meta, sort_keys=True).encode(), digest_size=SEED_BYTES)
    h.update(memoryview(blob)[data:])
    return h.digest()


def decode_version(blob: bytes) -> tuple[EncodedVersion, dict[str, str]]:
    meta = weights_metadata(blob)
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in st_load(blob).items():
        name, part = key.rsplit("::", 1)
        tensors.setdefault(name, {})[part] = t
    shapes = {k: tuple(v) for k, v in json.loads(meta["shapes"]).items()}
    enc = EncodedVersion(int(meta["version"]), int(meta["base"]) if meta["base"] else None, meta["codec"],
                         int(meta["block"]), tensors, shapes)
    return enc, json.loads(meta.get("aliases", "{}"))
