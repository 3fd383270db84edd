"""Versioned weights as keyframes and deltas, like a video codec, with error feedback.

The learner keeps two copies: its *true* weights (what it trains) and the *published* weights
(exactly what every sampler reconstructs). Each version is encoded as

    keyframe:  encode(true)                       published <- decode(keyframe)
    delta:     encode(true - published)           published <- published + decode(delta)

so lossy codecs never accumulate error: whatever a delta lost is still in (true - published)
and goes out with the next one (error feedback). Samplers apply the same float32 operations in the
same order, so their copy is bit-identical to the learner's published copy, and the behaviour
log-probs they report are those of the weights they really hold.

Codecs for a tensor x (float32):
    fp32        x as is (exact)
    bf16        x rounded to bfloat16
    int8        blockwise: per block of `block` values, scale = max|x| / 127, q = round(x / scale)
    topk_int8   the `topk_frac` largest |x| only (indices int32), their values int8 blockwise
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CODECS = ("fp32", "bf16", "int8", "topk_int8")


@dataclass(frozen=True)
class CodecConfig:
    codec: str = "int8"
    block: int = 256
    topk_frac: float = 0.05
    keyframe_codec: str = "fp32"
    keyframe_every: int = 20
    """A keyframe every N versions: a sampler that missed a base catches up from the last one."""

    def __post_init__(self) -> None:
        if self.codec not in CODECS or self.keyframe_codec not in ("fp32", "bf16"):
            raise ValueError(f"codec must be one of {CODECS}; keyframe_codec fp32 or bf16")
        if self.block < 1 or not 0 < self.topk_frac <= 1 or self.keyframe_every < 1:
            raise ValueError("codec: block >= 1, 0 < topk_frac <= 1, keyframe_every >= 1")


# ---- one tensor ----------------------------------------------------------------------------------

def _int8_blockwise(x: torch.Tensor, block: int) -> dict[str, torch.Tensor]:
    """x [n] float32 -> {"q": int8 [n], "scale": float32 [ceil(n / block)]}."""
    n = x.numel()
    pad = (-n) % block
    blocks = torch.nn.functional.pad(x, (0, pad)).view(-1, block)
    scale = blocks.abs().amax(dim=1) / 127.0
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(blocks / safe[:, None]).clamp(-127, 127).to(torch.int8).view(-1)[:n]
    return {"q": q, "scale": scale}


def _int8_decode(q: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    n = q.numel()
    pad = (-n) % block
    blocks = torch.nn.functional.pad(q.to(torch.float32), (0, pad)).view(-1, block)
    return (blocks * scale[:, None]).view(-1)[:n]


def encode_tensor(x: torch.Tensor, codec: str, block: int, topk_frac: float) -> dict[str, torch.Tensor]:
    flat = x.detach().to(torch.float32).reshape(-1)
    if codec == "fp32":
        return {"v": flat.clone()}
    if codec == "bf16":
        return {"v": flat.to(torch.bfloat16)}
    if codec == "int8":
        return _int8_blockwise(flat, block)
    k = max(1, math.ceil(topk_frac * flat.numel()))
    idx = flat.abs().topk(k, sorted=False).indices.sort().values
    return {"idx": idx.to(torch.int32), **_int8_blockwise(flat[idx], block)}


def decode_tensor(parts: dict[str, torch.Tensor], codec: str, block: int, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    if codec in ("fp32", "bf16"):
        flat = parts["v"].to(torch.float32)
    elif codec == "int8":
        flat = _int8_decode(parts["q"], parts["scale"], block)
    else:
        flat = torch.zeros(n, dtype=torch.float32, device=parts["q"].device)
        flat[parts["idx"].long()] = _int8_decode(parts["q"], parts["scale"], block)
    if flat.numel() != n:
        raise ValueError(f"decoded {flat.numel()} values for shape {shape}")
    return flat.view(shape)


# ---- a whole version -----------------------------------------------------------------------------

@dataclass
class EncodedVersion:
    version: int
    base: int | None
    """None for a keyframe; else the version this delta applies to."""
    codec: str
    block: int
    tensors: dict[str, dict[str, torch.Tensor]]
    shapes: dict[str, tuple[int, ...]]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for parts in self.tensors.values() for t in parts.values())


def apply_version(published: dict[str, torch.Tensor] | None, enc: EncodedVersion) -> dict[str, torch.Tensor]:
    """The published weights after `enc` (a new dict; float32). Samplers and the learner both call this."""
    decoded = {name: decode_tensor(parts, enc.codec, enc.block, enc.shapes[name]) for name, parts in enc.tensors.items()}
    if enc.base is None:
        return decoded
    if published is None or set(published) != set(decoded):
        raise ValueError(f"delta v{enc.version} needs base v{enc.base} with the same tensors")
    return {name: published[name] + decoded[name] for name in published}


class Publisher:
    """Learner side: turns true weights into keyframes and error-feedback deltas."""

    def __init__(self, cfg: CodecConfig) -> None:
        self.cfg = cfg
        self.published: dict[str, torch.Tensor] | None = None
        self.version: int | None = None

    def publish(self, true_weights: dict[str, torch.Tensor], version: int) -> EncodedVersion:
        keyframe = self.published is None or version % self.cfg.keyframe_every == 0
        true32 = {k: v.detach().to(torch.float32).cpu() for k, v in true_weights.items()}
        if keyframe:
            codec, source, base = self.cfg.keyframe_codec, true32, None
        else:
            codec, base = self.cfg.codec, self.version
            source = {k: true32[k] - self.published[k] for k in true32}
        enc = EncodedVersion(version, base, codec, self.cfg.block,
                             {k: encode_tensor(v, codec, self.cfg.block, self.cfg.topk_frac) for k, v in source.items()},
                             {k: tuple(v.shape) for k, v in true32.items()})
        self.published = apply_version(self.published, enc)
        self.version = version
        return enc
