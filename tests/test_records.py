"""The RolloutGroup wire codec: round trip, raw little-endian arrays, and every kind of bad input."""

import msgpack
import numpy as np
import pytest

from swarm.records import MAX_RECORD_BYTES, CompletionRecord, RecordError, RolloutGroup, decode_rollout_group


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


def test_swarm_layer_knows_bytes_not_torch():
    """docs/DESIGN.md, "Layout": swarm/ knows bytes and records, never torch models or node/ code."""
    import ast
    from pathlib import Path

    for path in Path(__file__).resolve().parents[1].joinpath("swarm").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("torch", "transformers", "node")), f"{path.name} imports {name}"
