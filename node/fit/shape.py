"""A model's shape (`ModelShape`): what its memory depends on, read from its config.json alone.

    shape = model_shape("Qwen/Qwen3-8B")      # the folder's / the hub cache's config.json, else QWEN3
    shape.parameters, shape.weight_bytes("bfloat16"), shape.kv_bytes_per_token("bfloat16")

No weights are loaded and nothing is downloaded: a builtin or a folder is read from disk, a hub id
from the local hub cache, and a Qwen3 hub id that is not cached from `QWEN3`, the published shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each compute dtype a node may run in."""


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder-only transformer (Qwen3, Qwen2, Llama): the figures its memory depends on."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    """The output head shares the embedding's matrix (counted once)."""
    qk_norm: bool = True
    """An RMSNorm over each head's queries and keys (Qwen3: 2 x head_dim weights a layer)."""
    qkv_bias: bool = False
    """Biases on the q, k, v projections (Qwen2 has them, Qwen3 not)."""
    max_positions: int | None = None
    """The longest sequence its position embedding was made for (config max_position_embeddings)."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | Any, name: str = "") -> "ModelShape":
        """From a config.json's dict or a transformers config object."""
        c = config if isinstance(config, Mapping) else config.to_dict()
        c = c.get("text_config") or c  # multimodal configs nest the language model's
        heads = int(c["num_attention_heads"])
        model_type = str(c.get("model_type", ""))
        return cls(name=name or str(c.get("_name_or_path") or model_type or "model"),
                   vocab=int(c["vocab_size"]), hidden=int(c["hidden_size"]), layers=int(c["num_hidden_layers"]),
                   heads=heads, kv_heads=int(c.get("num_key_value_heads") or heads),
                   head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
                   intermediate=int(c["intermediate_size"]), tied=bool(c.get("tie_word_embeddings", False)),
                   qk_norm=model_type.startswith("qwen3"),
                   qkv_bias=bool(c.get("attention_bias", model_type.startswith("qwen2"))),
                   max_positions=c.get("max_position_embeddings"))

    @property
    def layer_parameters(self) -> int:
        """One decoder layer: q, k, v, o projections (+ q/k norms, biases), the gated MLP, two norms."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * (q + 2 * kv) + q * h + (q + 2 * kv if self.qkv_bias else 0)
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attention + 3 * h * self.intermediate + norms

    @property
    def parameters(self) -> int:
        """Every parameter, the embedding (and an untied output head) included."""
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * self.layer_parameters + embeddings + self.hidden  # + the final norm

    def weight_bytes(self, dtype: str) -> int:
        return self.parameters * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str) -> int:
        """K and V of every layer for one token: 2 x layers x kv_heads x head_dim x dtype bytes
        (112 KiB for Qwen3-0.6B/1.7B in bfloat16, 144 KiB for 4B/8B)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES[dtype]

    @property
    def activation_values(self) -> int:
        """Values a training forward saves per token and layer for its backward: ~12 h + 4 f (the
        inputs of the norms, projections, attention and the MLP; examples/rehearsal.py's count)."""
        return 12 * self.hidden + 4 * self.intermediate

    def __str__(self) -> str:
        return f"{self.name} ({self.parameters / 1e9:.2f}B parameters)"


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> dict:
    return dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=tied,
                max_position_embeddings=40960, model_type="qwen3", attention_bias=False)


QWEN3: dict[str, dict] = {
    "Qwen/Qwen3-0.6B": _qwen3(1024, 3072, 28, 16, True),
    "Qwen/Qwen3-1.7B": _qwen3(2048, 6144, 28, 16, True),
    "Qwen/Qwen3-4B": _qwen3(2560, 9728, 36, 32, True),
    "Qwen/Qwen3-8B": _qwen3(4096, 12288, 36, 32, False),
    "Qwen/Qwen3-14B": _qwen3(5120, 17408, 40, 40, False),
    "Qwen/Qwen3-32B": _qwen3(5120, 25600, 64, 64, False),
}
"""The dense Qwen3 models' config.json figures as published on the Hugging Face hub (Qwen/Qwen3-*,
April 2025: every size has 8 KV heads of 128, a 151,936-token vocabulary and 40,960 positions; 0.6B
to 4B tie the output head to the embedding). examples/model_shapes.py builds 0.6B and 1.7B from the
same figures; tests/unit/node/test_fit.py counts a transformers Qwen3 built from each on the meta
device against `ModelShape.parameters`."""


def qwen3_shapes() -> list[ModelShape]:
    return [ModelShape.from_config(c, name) for name, c in QWEN3.items()]


class ShapeUnknown(ValueError):
    """No config.json for a model here (not a folder, not in the hub cache, not a published Qwen3)."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.fix = fix


def model_shape(model_id: str) -> ModelShape:
    """`model_id`'s shape from its config.json: a builtin or a folder on disk, a hub id from the local
    hub cache, else a published Qwen3 by name (`QWEN3`). Never asks the network."""
    folder = local_folder(model_id)
    if folder is not None:
        return ModelShape.from_config(json.loads((folder / "config.json").read_text()), model_id)
    cached = _cached_config(model_id)
    if cached is not None:
        return ModelShape.from_config(cached, model_id)
    known = {k.lower(): k for k in QWEN3}
    if model_id.lower().removesuffix("-base") in known:
        return ModelShape.from_config(QWEN3[known[model_id.lower().removesuffix("-base")]], model_id)
    raise ShapeUnknown(f"no config.json for {model_id!r} here (not a folder, not in the hub cache)",
                       f"download it first (`hf download {model_id} config.json`), or pass the model's folder")


def local_folder(model_id: str) -> Path | None:
    """The folder of a builtin or a path (node.models.ModelNotFoundError, in one line, for a wrong
    one); None for a hub id, which is not looked up here (resolving one may ask the hub)."""
    from node.models import resolve_model_path

    path = Path(model_id).expanduser()
    if model_id.startswith(("builtin:", ".", "/", "~")) or path.exists() or model_id.count("/") > 1:
        return Path(resolve_model_path(model_id))
    return None


def _cached_config(model_id: str) -> dict | None:
    """The hub cache's config.json of `model_id`, without asking the network."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(model_id, "config.json")
    except Exception:  # not a valid repo id, or no huggingface_hub: nothing cached to read
        return None
    return json.loads(Path(found).read_text()) if isinstance(found, str) else None
