"""Versions as lossless sparse patches of the view samplers run, with keyframes.

The learner trains float32 master weights; samplers run a *view* of them: every tensor rounded to
the view's dtype (bfloat16 for GPU swarms, float32 for the CPU demo) and laid end to end in one
flat tensor. A published version is

    keyframe:  the whole view                       view_v = decode(keyframe)
    patch:     the elements of the view that        view_v = view_{v-1} with those elements replaced
               changed since the last version

and a sampler's view is bit-identical to the learner's: no error accumulates, nothing is lossy,
and the view's xxh3-128 digest travels with each version and is checked after every rebuild. A
keyframe goes out when one is due (`keyframe_every`, `keyframe_bytes`) and whenever the patch would
be no smaller (e.g. a float32 view at a high lr, where every element moves): samplers treat any
version without a base as a keyframe, whatever its number.

Why this is small: an RL step at lr ~1e-6 moves a float32 weight far less than one bfloat16 ulp,
so only the few elements whose rounding flips change (a few % per step). A patch codes them as

    positions  gaps between changed flat indices, minus 1     (geometric: mostly one byte)
    steps      new bits - old bits of the view's integer       (+-1 for a one-ulp move)
               representation, wrapped to its width and zig-zagged to unsigned

each entropy-coded (node/weights/entropy.py: asymmetric numeral systems with one empirical law per run
of tensors), within ~1% of the entropy of the changed set (examples/bench_weights.py prints
both). A keyframe is the view's bits in byte planes (low bytes together, then the next...) under
zstd: the sign-and-exponent plane compresses, the mantissa's low bits hardly do.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash

from node.weights import entropy
from node.weights.entropy import GAP_ESCAPE, STEP_ESCAPE, pack_planes, unpack_planes

VIEWS = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_INT_OF = {torch.bfloat16: torch.int16, torch.float32: torch.int32}


@dataclass(frozen=True)
class PublishConfig:
    """How the learner publishes versions (`[learner.weights]`)."""

    view: str = "auto"
    """What samplers run: bfloat16, float32, or auto (bfloat16 when the learner trains on a GPU,
    float32 on CPU, as the CPU demo's samplers compute in float32)."""
    every_steps: int = 1
    """Publish a version at most every N optimizer steps (samplers run behind; GEPO corrects)."""
    min_interval_s: float = 0.0
    """...and at most one every this many seconds."""
    max_upload_mbit_s: float = 0.0
    """...and no faster than this upload budget allows: after a version of B bytes the next waits
    8 B / budget seconds (0: no budget). Samplers share versions, so the learner uploads each
    about once (README, "WAN")."""
    keyframe_every: int = 100
    """A keyframe every N published versions (1: keyframes only)..."""
    keyframe_bytes: float = 2.0
    """...or once the patches since the last keyframe add up to this many keyframes' bytes: a
    newcomer then catches up with at most (1 + this) keyframes' worth of download."""
    zstd_level: int = 3
    """zstd level of keyframes (1-19); 3 codes ~150 MB/s per core (patches are entropy-coded)."""

    def __post_init__(self) -> None:
        if self.view not in ("auto", *VIEWS):
            raise ValueError(f"weights.view must be auto, bfloat16 or float32, not {self.view!r}")
        if self.every_steps < 1 or self.keyframe_every < 1 or not 1 <= self.zstd_level <= 19:
            raise ValueError("weights: every_steps >= 1, keyframe_every >= 1, 1 <= zstd_level <= 19")
        if self.min_interval_s < 0 or self.max_upload_mbit_s < 0 or self.keyframe_bytes <= 0:
            raise ValueError("weights: min_interval_s >= 0, max_upload_mbit_s >= 0, keyframe_bytes > 0")

    def view_dtype(self, device: torch.device | str) -> torch.dtype:
        if self.view != "auto":
            return VIEWS[self.view]
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def publish_due(cfg: PublishConfig, steps_since: int, seconds_since: float, last_bytes: int) -> bool:
    """Whether the learner publishes now: every_steps steps, min_interval_s seconds and the upload
    budget's 8 * last_bytes / (max_upload_mbit_s * 1e6) seconds have all passed since the last."""
    budget_s = 8 * last_bytes / (cfg.max_upload_mbit_s * 1e6) if cfg.max_upload_mbit_s else 0.0
    return steps_since >= cfg.every_steps and seconds_since >= max(cfg.min_interval_s, budget_s)


# ---- the view: one flat tensor -------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where each tensor sits in the flat view: names in order and their shapes."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @staticmethod
    def of(weights: dict[str, torch.Tensor]) -> Layout:
        return Layout(tuple(weights), tuple(tuple(t.shape) for t in weights.values()))

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def tensors(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """{name: a view into `flat` with its shape} (no copy)."""
        out, at = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = math.prod(shape)
            out[name] = flat[at : at + n].view(shape)
            at += n
        return out


def make_view(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The flat view: every tensor rounded to `dtype` (round to nearest even), end to end, on the
    weights' device (a GPU learner compares views on the GPU and moves only the patch)."""
    return torch.cat([t.detach().reshape(-1).to(dtype) for t in weights.values()])


def view_digest(flat: torch.Tensor) -> str:
    """xxh3-128 of the view's bytes: checks a rebuild (the blob itself is sha256-checked against
    the learner's signed manifest; this catches a patch applied to the wrong base)."""
    return xxhash.xxh3_128_hexdigest(_bits(flat).cpu().numpy().view(np.uint8))


def _bits(flat: torch.Tensor) -> torch.Tensor:
    return flat.view(_INT_OF[flat.dtype])


# ---- one version ---------------------------------------------------------------------------------

@dataclass
class EncodedVersion:
    version: int
    base: int | None
    """None for a keyframe; else the version this patch applies to."""
    view: str
    """The view's dtype: bfloat16 or float32."""
    layout: Layout
    count: int
    """Values coded: every element for a keyframe, the changed ones for a patch."""
    positions: bytes
    """Patch: the entropy-coded (gap - 1) between changed flat indices; empty for a keyframe."""
    position_planes: int
    """0 (a patch's streams describe themselves)."""
    values: bytes
    """Keyframe: zstd byte planes of the view's bits; patch: the entropy-coded zig-zagged steps."""
    value_planes: int
    """Keyframe: the planes kept; 0 for a patch."""
    digest: str
    """view_digest of the view this version rebuilds."""
    stats: dict = field(default_factory=dict)
    """Learner-side figures for the metrics (not sent): changed fraction, encode seconds."""

    def nbytes(self) -> int:
        return len(self.positions) + len(self.values)


def _width(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits


def encode_keyframe(flat: torch.Tensor, level: int) -> tuple[bytes, int]:
    bits = _bits(flat).cpu().numpy()
    unsigned = bits.view(np.uint16 if bits.dtype == np.int16 else np.uint32)
    return pack_planes(unsigned, level)


def patch_of(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(changed flat indices, zig-zagged steps), both int64 on the views' device.

    step = new_bits - old_bits wrapped to the width w (new_bits = old_bits + step mod 2^w, so any
    change is exact, sign flips included), then zigzag(step) = 2 step ^ (step >> 63): +-1 -> 2, 1.
    """
    old_b, new_b = _bits(old), _bits(new)
    idx = (old_b != new_b).nonzero().view(-1)
    w = _width(old.dtype)
    mask, half = (1 << w) - 1, 1 << (w - 1)
    step = ((new_b[idx].long() - old_b[idx].long() + half) & mask) - half
    return idx, (step << 1) ^ (step >> 63)


def apply_patch(old: torch.Tensor, idx: torch.Tensor, zigzag: torch.Tensor) -> torch.Tensor:
    """The view after a patch (a new tensor): old_bits[idx] + step, wrapped to the width."""
    w = _width(old.dtype)
    step = (zigzag >> 1) ^ -(zigzag & 1)
    new = old.clone()
    bits = _bits(new)
    wrapped = (bits[idx].long() + step) & ((1 << w) - 1)
    bits[idx] = (wrapped - ((wrapped >> (w - 1)) << w)).to(bits.dtype)  # back to signed w-bit
    return new


def encode_patch(old: torch.Tensor, new: torch.Tensor, layout: Layout | None = None) -> tuple[bytes, bytes, int]:
    """(positions, steps, changed count) of the patch old -> new, each an entropy-coded stream
    (node/weights/entropy.py) whose segments are runs of the layout's tensors (one segment if None)."""
    idx, zigzag = patch_of(old, new)
    idx, zigzag = idx.cpu().numpy(), zigzag.cpu().numpy()
    gaps = np.diff(idx, prepend=-1) - 1
    ends = np.cumsum([math.prod(s) for s in layout.shapes]) if layout is not None else np.zeros(0, dtype=np.int64)
    segs = entropy.segments(np.searchsorted(idx, ends), int(idx.size))
    positions = entropy.encode(gaps.view(np.uint64), segs, GAP_ESCAPE)
    return positions, entropy.encode(zigzag.view(np.uint64), segs, STEP_ESCAPE), int(idx.size)


def apply_version(held: torch.Tensor | None, enc: EncodedVersion) -> torch.Tensor:
    """The view after `enc` (a new flat tensor on `held`'s device, CPU for a keyframe); raises
    ValueError if the version does not decode to the digest the learner published."""
    dtype = VIEWS[enc.view]
    n = enc.layout.numel
    if enc.base is None:
        if enc.count != n:
            raise ValueError(f"keyframe v{enc.version} has {enc.count} values for {n} elements")
        unsigned, signed = (np.uint16, np.int16) if _width(dtype) == 16 else (np.uint32, np.int32)
        bits = unpack_planes(enc.values, enc.value_planes, n, unsigned)
        flat = torch.from_numpy(bits.view(signed)).view(dtype)
    else:
        if held is None or held.dtype != dtype or held.numel() != n:
            raise ValueError(f"patch v{enc.version} needs a {enc.view} base of {n} elements")
        if enc.count > n:
            raise ValueError(f"patch v{enc.version} changes {enc.count} of {n} elements")
        gaps = entropy.decode(enc.positions, enc.count, GAP_ESCAPE)
        if enc.count and gaps.max() >= n:  # each gap < n, so the running sum cannot overflow
            raise ValueError(f"patch v{enc.version} skips past the view's {n} elements")
        idx = np.cumsum(gaps.view(np.int64) + 1) - 1
        if enc.count and idx[-1] >= n:
            raise ValueError(f"patch v{enc.version} touches element {idx[-1]} of {n}")
        zigzag = entropy.decode(enc.values, enc.count, STEP_ESCAPE).view(np.int64)
        flat = apply_patch(held, torch.from_numpy(idx).to(held.device), torch.from_numpy(zigzag).to(held.device))
    if view_digest(flat) != enc.digest:
        raise ValueError(f"version {enc.version} rebuilt a view whose digest is not the published one")
    return flat


RACE_AT = 0.5
"""A patch of at least this share of the last keyframe's bytes is raced against a keyframe of the
same view, and the smaller one goes out (a keyframe on a tie). A smaller patch goes out unraced:
to lose, the view's keyframe would have to have shrunk by half since the last one, which weights
that drift a little per step do not do, while racing every patch would add a keyframe's encode to
every version of a bfloat16 view at lr ~1e-6, whose patches are a few % of a keyframe."""


class Publisher:
    """Learner side: master weights -> keyframes and patches of their view; no patch larger than
    a keyframe of the same view goes out (`RACE_AT` says how that is checked cheaply)."""

    def __init__(self, cfg: PublishConfig, dtype: torch.dtype) -> None:
        self.cfg = cfg
        self.dtype = dtype
        self.view_name = next(k for k, v in VIEWS.items() if v == dtype)
        self.published: torch.Tensor | None = None
        """The flat view every sampler holds now (on the weights' device)."""
        self.layout: Layout | None = None
        self.version: int | None = None
        self._since_keyframe = 0
        self._patch_bytes = 0
        self._keyframe_bytes = 0
        """Bytes of the last keyframe published, scheduled or in place of a larger patch."""

    def _keyframe_due(self, layout: Layout) -> bool:
        return (self.published is None or layout != self.layout or self._since_keyframe + 1 >= self.cfg.keyframe_every
                or self._patch_bytes >= self.cfg.keyframe_bytes * self._keyframe_bytes)

    def _encode(self, view: torch.Tensor, layout: Layout, version: int) -> tuple[EncodedVersion, float]:
        """(the version to publish, the changed fraction: 1.0 for a scheduled keyframe, which
        compares nothing). A keyframe when one is due or when the patch would be no smaller."""
        level, digest = self.cfg.zstd_level, view_digest(view)
        patch, changed = None, 1.0
        if not self._keyframe_due(layout):
            positions, values, count = encode_patch(self.published, view, layout)
            patch = EncodedVersion(version, self.version, self.view_name, layout, count, positions, 0, values, 0,
                                   digest)
            changed = count / max(1, view.numel())
            if patch.nbytes() < RACE_AT * self._keyframe_bytes:
                return patch, changed
        values, vp = encode_keyframe(view, level)
        keyframe = EncodedVersion(version, None, self.view_name, layout, view.numel(), b"", 1, values, vp, digest)
        return (keyframe if patch is None or keyframe.nbytes() <= patch.nbytes() else patch), changed

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> EncodedVersion:
        """The version `version` of `weights`; its `stats` are the step record's figures: bytes sent,
        kind ("keyframe" | "patch"), the changed fraction, bytes vs a full copy of the view in its
        own dtype (`weights_bytes_vs_view`) and vs a bfloat16 copy, and the encode seconds (a
        keyframe raced against a patch included)."""
        t0 = time.perf_counter()
        layout = Layout.of(weights)
        view = make_view(weights, self.dtype)
        enc, changed = self._encode(view, layout, version)
        if enc.base is None:  # scheduled or not: the patch count and byte budget start again from it
            self._since_keyframe, self._patch_bytes, self._keyframe_bytes = 0, 0, enc.nbytes()
        else:
            self._since_keyframe += 1
            self._patch_bytes += enc.nbytes()
        self.published, self.layout, self.version = view, layout, version
        n = max(1, view.numel())
        enc.stats = {"weights_bytes": enc.nbytes(), "weights_kind": "keyframe" if enc.base is None else "patch",
                     "weights_keyframe": enc.base is None, "weights_changed_frac": changed,
                     "weights_bytes_vs_view": enc.nbytes() / (n * view.element_size()),
                     "weights_bytes_vs_bf16": enc.nbytes() / (2 * n),
                     "weights_encode_s": time.perf_counter() - t0}
        return enc


def entropy_bound_bytes(old: torch.Tensor, new: torch.Tensor, layout: Layout | None = None) -> float:
    """The physical limit for a patch old -> new: per tensor, which elements changed (n H(c / n) bits,
    H the binary entropy) plus by how many steps (c times the entropy of the steps' empirical
    distribution), summed over the layout's tensors (one segment if None), in bytes. A code that
    treats elements as independent cannot do better on average."""
    sizes = [math.prod(s) for s in layout.shapes] if layout is not None else [old.numel()]
    bits, at = 0.0, 0
    for n in sizes:
        idx, zigzag = patch_of(old[at : at + n], new[at : at + n])
        at += n
        c = idx.numel()
        if 0 < c < n:
            p = c / n
            bits += n * -(p * math.log2(p) + (1 - p) * math.log2(1 - p))
        if c:
            q = torch.unique(zigzag, return_counts=True)[1].double() / c
            bits += c * float(-(q * q.log2()).sum())
    return bits / 8
