"""The entropy coder of weight patches (node/weights/entropy.py): exact round trips, sizes at the
empirical entropy, and refusal of every malformed stream."""

import math

import msgpack
import numpy as np
import pytest

from node.weights import entropy


def exact_mix(counts: dict[int, int], seed: int = 0) -> np.ndarray:
    """Values with exactly these counts, shuffled: their empirical entropy is known by hand."""
    values = np.concatenate([np.full(c, v, dtype=np.uint64) for v, c in counts.items()])
    return np.random.default_rng(seed).permutation(values)


def test_segments_close_at_the_first_tensor_end_past_the_least():
    # tensors end after 3, 10, 12 and 30 values; at least 5 per segment
    assert entropy.segments(np.array([3, 10, 12, 30]), 30, least=5) == [10, 20]
    assert entropy.segments(np.array([3, 10, 12, 30]), 30, least=1) == [3, 7, 2, 18]
    assert entropy.segments(np.array([3, 10]), 10, least=100) == [10]
    assert entropy.segments(np.zeros(0, dtype=np.int64), 7) == [7]
    assert entropy.segments(np.array([0, 0, 0]), 0, least=1) == [0]
    # however many values and tensors, never more segments than a decoder accepts
    many = entropy.segments(np.arange(1, 10**6) * 5000, 5 * 10**9)
    assert len(many) <= entropy.MAX_SEGMENTS and sum(many) == 5 * 10**9


@pytest.mark.parametrize("segs", [[60_000], [10_000, 1, 49_999], [1, 59_999]])
def test_round_trip_with_escapes_and_segments(segs):
    rng = np.random.default_rng(1)
    values = rng.geometric(0.05, size=60_000).astype(np.uint64)
    values[::997] = np.uint64(2**63 + 5)  # far past the escape, every plane in use
    values[::1009] = 0
    blob = entropy.encode(values, segs, 64)
    assert np.array_equal(entropy.decode(blob, values.size, 64), values)


def test_empty_stream():
    blob = entropy.encode(np.zeros(0, dtype=np.uint64), [0], 16)
    assert entropy.decode(blob, 0, 16).size == 0


def test_a_stream_costs_its_empirical_entropy():
    # 50% ones, 25% twos, 12.5% each of 3 and 4: exactly 1.75 bits a value by hand
    n = 80_000
    values = exact_mix({1: n // 2, 2: n // 4, 3: n // 8, 4: n // 8})
    words = len(msgpack.unpackb(entropy.encode(values, [n], 16))["w"])
    assert words / (1.75 * n / 8) == pytest.approx(1.0, abs=0.002)  # ANS: within a fraction of a %
    # two segments of different laws cost the sum of their own entropies, not the mixture's
    a, b = exact_mix({1: n}), exact_mix({1: n // 2, 2: n // 2}, seed=1)  # 0 and 1 bit a value
    two = len(msgpack.unpackb(entropy.encode(np.concatenate([a, b]), [n, n], 16))["w"])
    mixture = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)) * 2 * n / 8  # one law: 0.81 bits
    assert two < 1.01 * n / 8 < 0.7 * mixture


def _frame_declaring(size: int) -> bytes:
    """A zstd frame whose header declares `size` bytes of content (zstandard would allocate them)."""
    import zstandard

    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b"\x00" * 70_000))
    # header: magic (4), descriptor (1: FCS_flag 2 bits -> 4-byte size for 70,000 bytes), then size
    assert zstandard.frame_content_size(bytes(frame)) == 70_000 and frame[4] >> 6 == 2
    frame[4] |= 0xC0  # 8-byte content size field...
    return bytes(frame[:5]) + size.to_bytes(8, "little") + bytes(frame[9:])  # ...holding `size`


def test_every_malformed_stream_is_refused():
    values = exact_mix({0: 300, 1: 200, 70: 10})
    good = entropy.encode(values, [250, 260], 64)
    d = msgpack.unpackb(good)

    def redo(**kw):
        return msgpack.packb({**d, **kw})

    cases = {
        "not msgpack": b"\x00\x01garbage",
        "a list": msgpack.packb([1, 2]),
        "no words": msgpack.packb({k: v for k, v in d.items() if k != "w"}),
        "another escape": redo(k=32),
        "segments off the count": redo(n=[250, 261]),
        "a negative segment": redo(n=[-1, 511]),
        "tables not zstd": redo(t=b"nope"),
        "tables cut short": redo(t=d["t"][:-3]),
        "words not whole": redo(w=d["w"][:-1]),
        "words cut short": redo(w=d["w"][4:]),
        "words left over": redo(w=b"\x07\x00\x00\x00" + d["w"]),
        "no words at all": redo(w=b""),
        "escapes missing": redo(e=b"", ep=1),
        "escapes not zstd": redo(e=b"nope"),
        "planes not a number": redo(ep="1"),
        "segments not a list": redo(n=510),
        "a segment not a number": redo(n=["x", 510]),
        "a segment a list": redo(n=[[250], 260]),
        "an empty segment": redo(n=[250, 0, 260]),
        "more segments than tables may take": redo(n=[1] * 510),
        "tables declaring 2**50 bytes": redo(t=_frame_declaring(2**50)),
        "escapes declaring 2**50 bytes": redo(e=_frame_declaring(2**50)),
    }
    for name, blob in cases.items():
        with pytest.raises(ValueError):
            entropy.decode(blob, values.size, 64)
            pytest.fail(name)
    with pytest.raises(ValueError):
        entropy.decode(good, values.size + 1, 64)  # the count the header promised
    assert np.array_equal(entropy.decode(good, values.size, 64), values)
