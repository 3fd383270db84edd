"""Weights as bytes for the exchange: a full keyframe in safetensors format, with its metadata.

The blob carries the model id and the version in the safetensors header metadata, so a sampler
can refuse weights for another model before loading anything. Tensors that share storage (tied
input/output embeddings) are sent once and listed as aliases, not duplicated. (Deltas against a
base version come with the weight-delta issue.)
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from swarm.weights_meta import weights_metadata


def encode_weights(state_dict: dict[str, torch.Tensor], model_id: str, version: int) -> bytes:
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_storage: dict[tuple[int, int, tuple], str] = {}
    for name, t in state_dict.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in by_storage:
            aliases[name] = by_storage[key]
            continue
        by_storage[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    meta = {"model_id": model_id, "version": str(version), "codec": "full", "aliases": json.dumps(aliases)}
    return st_save(tensors, metadata=meta)


def decode_weights(blob: bytes) -> dict[str, torch.Tensor]:
    tensors = st_load(blob)
    for alias, target in json.loads(weights_metadata(blob).get("aliases", "{}")).items():
        tensors[alias] = tensors[target]
    return tensors
