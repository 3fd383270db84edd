"""Non-negative integers at their empirical entropy: the coder of weight patches' gaps and steps.

A patch's gaps and steps (node/weights/codec.py) are drawn from a few values far more often than
from the rest: gaps from a geometric-like law around 1 / (changed fraction), bf16 steps from +-1.
zstd's Huffman literals spend whole bits per byte (~2.5 bits on a step whose entropy is ~1.9), so
this coder uses asymmetric numeral systems (the `constriction` library), which spend the
empirical entropy to within a fraction of a percent:

    symbol    s = min(v, K)                          K: the alphabet's escape (4096 for gaps)
    model     per segment, the counts of s in it     a categorical law, sent as a table
    escapes   v - K for every s = K, in zstd byte planes (sign flips near zero, huge gaps)

Segments are runs of whole tensors with at least `SEGMENT` values: a tensor's change rate is set
by its weights' scale against a bf16 ulp, so embeddings, projections and norms differ, and one law
per run of them comes within ~0.2% of the per-tensor entropy bound where one law for the whole
view lost ~1%; each table costs ~1-3 kB, so segments stay large.

    blob  msgpack {"k": K, "n": [values per segment], "t": zstd(uint32 counts, segments x (K+1)),
                   "w": ANS words (uint32, little-endian), "e": zstd byte planes of escapes, "ep": planes}

The decoder checks everything a malformed blob could get wrong (table sums, escape counts, words
left over) and raises ValueError: the learner signs each version, but a sampler must still never
crash on one.
"""

from __future__ import annotations

import constriction
import msgpack
import numpy as np
import zstandard

SEGMENT = 1 << 20
"""Least values per segment (whole tensors are added until a segment holds this many)."""
GAP_ESCAPE = 4096
"""Gaps of at least this go out as escapes: a geometric law of mean 1 / 0.5% puts ~1e-9 of its
gaps there; the long runs of unchanged elements (norms, unused embedding rows) escape."""
STEP_ESCAPE = 256
"""Zig-zagged steps of at least this go out as escapes: bf16 steps are mostly 1-8; a float32 view
at a high lr (the CPU demo) escapes most steps, costing what the zstd planes always cost."""
_MAX_K = 1 << 16
"""Largest escape accepted from a blob (a table has K + 1 counts per segment)."""
MAX_SEGMENTS = 1024
"""Most segments a blob may have: its tables then take at most 16 MiB at K = 4096 (a 0.6B view's
patch has ~7-25 segments of 1M values)."""


def segments(ends: np.ndarray, total: int, least: int = SEGMENT) -> list[int]:
    """Values per segment: `ends` are the running value counts where each tensor ends (sorted),
    `total` the number of values; a segment closes at the first tensor end where it holds at
    least `least`, and the last one takes the rest. `least` grows with `total` so that there are never
    more than MAX_SEGMENTS, the most a decoder accepts (a 70B view's patch holds ~3e9 values)."""
    least = max(least, -(-total // (MAX_SEGMENTS - 1)))
    out, start = [], 0
    for end in np.asarray(ends).tolist():
        if end - start >= least and end < total:
            out.append(int(end - start))
            start = int(end)
    out.append(total - start)
    return out


# ---- byte planes + zstd: keyframes and escapes -------------------------------------------------

def pack_planes(values: np.ndarray, level: int) -> tuple[bytes, int]:
    """Unsigned integers -> (zstd of their byte planes, number of planes). Plane j holds byte j of
    every value (little-endian); planes above the largest value's top byte are left out."""
    width = values.dtype.itemsize
    planes = max(1, (int(values.max()).bit_length() + 7) // 8) if values.size else 1
    shuffled = values.view(np.uint8).reshape(-1, width)[:, :planes].T.copy()
    return zstandard.ZstdCompressor(level=level).compress(shuffled.tobytes()), planes


def unpack_planes(data: bytes, planes: int, count: int, dtype: type = np.uint64) -> np.ndarray:
    """Inverse of `pack_planes`: `count` values of the unsigned `dtype`."""
    width = np.dtype(dtype).itemsize
    if not 1 <= planes <= width:
        raise ValueError(f"{planes} byte planes for {width}-byte values")
    raw = _unzstd(data, planes * count, "byte planes") if count else b""
    if len(raw) != planes * count:
        raise ValueError(f"{len(raw)} bytes of planes for {count} values x {planes}")
    out = np.zeros((count, width), dtype=np.uint8)
    out[:, :planes] = np.frombuffer(raw, dtype=np.uint8).reshape(planes, count).T
    return out.view(np.dtype(dtype).newbyteorder("<")).reshape(-1)



# ---- entropy-coded streams ---------------------------------------------------------------------

def encode(values: np.ndarray, seg_counts: list[int], k: int) -> bytes:
    """`values` (uint64) -> the blob; `seg_counts` sum to len(values) (see `segments`)."""
    if sum(seg_counts) != values.size or not 1 <= k <= _MAX_K:
        raise ValueError(f"{values.size} values in segments of {sum(seg_counts)}; escape {k}")
    symbols = np.minimum(values, k).astype(np.int32)
    coder = constriction.stream.stack.AnsCoder()
    bounds = np.cumsum([0, *seg_counts])
    tables = np.zeros((len(seg_counts), k + 1), dtype=np.uint32)
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        tables[i] = np.bincount(symbols[a:b], minlength=k + 1)
    for i in reversed(range(len(seg_counts))):  # a stack: the last segment goes in first
        a, b = bounds[i], bounds[i + 1]
        if b > a:
            coder.encode_reverse(symbols[a:b], _model(tables[i]))
    escapes = values[symbols == k] - np.uint64(k)
    esc, planes = pack_planes(escapes, level=3)
    return msgpack.packb({"k": k, "n": [int(c) for c in seg_counts],
                          "t": zstandard.ZstdCompressor(level=19).compress(tables.tobytes()),
                          "w": coder.get_compressed().astype("<u4").tobytes(), "e": esc, "ep": planes})


def decode(blob: bytes, count: int, k: int) -> np.ndarray:
    """The blob -> `count` values (uint64); ValueError on anything that is not such a blob."""
    try:
        d = msgpack.unpackb(blob, raw=False, max_bin_len=len(blob), max_array_len=1 << 20, max_map_len=16)
        k_, seg_counts, t, words, esc, planes = d["k"], d["n"], d["t"], d["w"], d["e"], d["ep"]
    except (ValueError, KeyError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ValueError(f"not an entropy-coded stream: {type(e).__name__}") from e
    if not (isinstance(seg_counts, list) and all(isinstance(b, bytes) for b in (t, words, esc))
            and isinstance(planes, int) and all(type(c) is int for c in seg_counts)):
        raise ValueError("an entropy-coded stream's fields have the wrong types")
    # every segment holds values (one empty one for an empty stream): their number bounds the tables
    nonempty = seg_counts == [0] if count == 0 else all(c >= 1 for c in seg_counts)
    if k_ != k or not nonempty or not 1 <= len(seg_counts) <= MAX_SEGMENTS or sum(seg_counts) != count:
        raise ValueError(f"a stream of escape {k_!r} and {len(seg_counts)} segments is not one of escape {k} "
                         f"and {count} values in 1-{MAX_SEGMENTS} non-empty segments")
    size = len(seg_counts) * (k + 1) * 4
    raw = _unzstd(t, size, "entropy tables")
    if len(raw) != size or len(words) % 4:
        raise ValueError("entropy tables or words of the wrong size")
    tables = np.frombuffer(raw, dtype="<u4").reshape(len(seg_counts), k + 1)
    if (tables.sum(1, dtype=np.int64) != np.asarray(seg_counts, dtype=np.int64)).any():
        raise ValueError("an entropy table does not sum to its segment's values")
    w = np.frombuffer(words, dtype="<u4").astype(np.uint32)
    try:
        coder = constriction.stream.stack.AnsCoder(w) if w.size else constriction.stream.stack.AnsCoder()
        parts = [coder.decode(_model(tab), n).astype(np.uint64) for tab, n in zip(tables, seg_counts) if n]
    except ValueError as e:
        raise ValueError(f"entropy words: {e}") from e
    if not coder.is_empty():
        raise ValueError("entropy words left over after the last value")
    values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    escaped = values == k
    n_esc = int(escaped.sum())
    if n_esc != int(tables[:, k].sum()):
        raise ValueError("decoded escapes do not match the tables")
    values[escaped] += unpack_planes(esc, planes, n_esc) if n_esc else np.zeros(0, dtype=np.uint64)
    return values


def _unzstd(data: bytes, size: int, what: str) -> bytes:
    """zstd-decompress `data` that must hold exactly `size` bytes. A frame's declared size is
    checked first: zstandard allocates what a frame declares, whatever `max_output_size` says."""
    try:
        declared = zstandard.frame_content_size(data)
        if declared not in (size, zstandard.CONTENTSIZE_UNKNOWN):
            raise ValueError(f"{what}: a frame of {declared} bytes where {size} are expected")
        return zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
    except zstandard.ZstdError as e:
        raise ValueError(f"{what}: {e}") from e


def _model(counts: np.ndarray):
    # Every symbol keeps at least the smallest representable probability (constriction's
    # guarantee), so a zero count costs nothing to encode and cannot make decoding fail.
    return constriction.stream.model.Categorical(counts.astype(np.float64) + 0.0, perfect=False)
