"""The RolloutGroup wire codec: round trip, raw little-endian arrays, and every kind of bad input."""

import msgpack
import numpy as np
import pytest

from swarm.wire.rollout import (MAX_RECORD_BYTES, MAX_UNKNOWN_BYTES, CompletionRecord, RecordError, RolloutGroup,
                           decode_rollout_group, unknown_bytes)


def group(**kw) -> RolloutGroup:
    base = dict(id="g1", swarm="s", task="t", prompt_id="p1", prompt="1+1=", model_id="m", tokenizer="tk",
                version=3, sampler="peerA", created=1.5, sampling={"temperature": 1.0},
                completions=[CompletionRecord("2", [5, 1], [-0.25, -0.5], "stop", 1.0),
                             CompletionRecord("3", [6, 1], [-1.0, -0.125], "stop", 0.0)])
    base.update(kw)
    return RolloutGroup(**base)


def raw(**overrides) -> bytes:
    d = msgpack.unpackb(group().encode(), raw=False)
    d.update(overrides)
    return msgpack.packb(d, use_bin_type=True)


def test_round_trip_with_raw_little_endian_arrays():
    g = group()
    data = g.encode()
    d = msgpack.unpackb(data, raw=False)
    assert d["completions"][0]["token_ids"] == np.array([5, 1], "<u4").tobytes()
    assert d["completions"][0]["logprobs"] == np.array([-0.25, -0.5], "<f4").tobytes()
    assert decode_rollout_group(data) == g


def test_unknown_extra_fields_are_tolerated():
    g = decode_rollout_group(raw(future_field={"x": 1}))
    assert g.id == "g1"


def with_completion_field(top_level: bytes = b"", **extra) -> bytes:
    """A record with `extra` fields in its second completion (and a `top_level` one, if given)."""
    d = msgpack.unpackb(group().encode(), raw=False)
    d["completions"][1].update(extra)
    if top_level:
        d["x"] = top_level
    return msgpack.packb(d, use_bin_type=True)


@pytest.mark.parametrize("data", [
    raw(padding=b"\x00" * (1 << 20)),  # the attack: 1 MiB of padding in every record
    raw(a=b"\x00" * 300, b=b"\x00" * 300),  # two small ones, together over the bound
    with_completion_field(padding="x" * 600),  # inside a completion
    with_completion_field(b=b"\x00" * 300, top_level=b"\x00" * 300),  # 300 bytes at the top, 300 in a completion
])
def test_unknown_fields_beyond_512_bytes_in_all_are_refused(data):
    with pytest.raises(RecordError) as e:
        decode_rollout_group(data)
    assert e.value.reason == "unknown_fields", e.value


def test_unknown_fields_at_the_bound_pass_and_sampling_is_bounded_too():
    d = msgpack.unpackb(group().encode(), raw=False)
    # {"pad": <bin of n>} encodes as 1 (map) + 4 ("pad") + 3 (bin 16 header) + n bytes
    at_bound = msgpack.packb({**d, "pad": b"\x00" * (MAX_UNKNOWN_BYTES - 8)}, use_bin_type=True)
    assert unknown_bytes({**d, "pad": b"\x00" * (MAX_UNKNOWN_BYTES - 8)}, frozenset(d)) == MAX_UNKNOWN_BYTES
    assert decode_rollout_group(at_bound).id == "g1"
    with pytest.raises(RecordError) as e:
        decode_rollout_group(msgpack.packb({**d, "pad": b"\x00" * (MAX_UNKNOWN_BYTES - 7)}, use_bin_type=True))
    assert e.value.reason == "unknown_fields"
    with pytest.raises(RecordError) as e:
        decode_rollout_group(raw(sampling={"temperature": 1.0, "note": "x" * 2000}))
    assert e.value.reason == "oversize"
    # a record accepted before the bound existed (a checkpoint's buffer) still loads when asked to
    assert decode_rollout_group(raw(padding=b"\x00" * 4096), strict=False).id == "g1"


@pytest.mark.parametrize("data,reason", [
    (b"\xc1\xc1\xc1", "undecodable"),
    (msgpack.packb([1, 2, 3]), "schema"),
    (raw(version="3"), "schema"),
    (raw(version=True), "schema"),
    (raw(version=-1), "schema"),
    (raw(protocol=99), "protocol"),
    (raw(completions=[]), "sizes"),
])
def test_malformed_records_are_rejected_with_a_reason(data, reason):
    with pytest.raises(RecordError) as e:
        decode_rollout_group(data)
    assert e.value.reason == reason


def test_missing_field_sizes_nan_and_oversize():
    d = msgpack.unpackb(group().encode(), raw=False)
    del d["prompt_id"]
    with pytest.raises(RecordError, match="prompt_id"):
        decode_rollout_group(msgpack.packb(d))
    d = msgpack.unpackb(group().encode(), raw=False)
    d["completions"][0]["logprobs"] = d["completions"][0]["logprobs"][:4]
    with pytest.raises(RecordError) as e:
        decode_rollout_group(msgpack.packb(d, use_bin_type=True))
    assert e.value.reason == "sizes"
    nan = group(completions=[CompletionRecord("2", [5], [float("nan")], "stop", 1.0)] * 2)
    with pytest.raises(RecordError) as e:
        decode_rollout_group(nan.encode())
    assert e.value.reason == "nonfinite"
    with pytest.raises(RecordError) as e:
        decode_rollout_group(b"\x00" * (MAX_RECORD_BYTES + 1))
    assert e.value.reason == "oversize"
    huge = group(completions=[CompletionRecord("x" * 100, list(range(600_000)), [-1.0] * 600_000, "length", 0.0)])
    with pytest.raises(RecordError) as e:
        huge.encode()
    assert e.value.reason == "oversize"
