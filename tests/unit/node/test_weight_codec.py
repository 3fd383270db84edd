"""The weight codec (node/weights/codec.py): lossless patches of the view samplers run."""

import math

import numpy as np
import pytest
import torch

from node.weights import entropy
from node.weights.entropy import GAP_ESCAPE, STEP_ESCAPE
from node.weights.codec import (EncodedVersion, Layout, Publisher, PublishConfig, apply_version, encode_keyframe,
                               encode_patch, entropy_bound_bytes, make_view, pack_planes, patch_of, publish_due,
                               unpack_planes)
from node.weights.blob import decode_version, encode_version

BF16 = torch.bfloat16


def bf16(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32).to(BF16)


def test_a_patch_codes_positions_as_gaps_and_changes_as_zigzagged_bit_steps():
    old = bf16(1.0, 0.5, -2.0, 0.0, 3.0, 7.0)
    # 1.0 -> next bf16 up (+1 ulp); -2.0 -> -2.015625 (sign-magnitude: bits +1); 0.0 -> -0.0
    # (bits 0x0000 -> 0x8000: -32768, wrapped); 7.0 -> 6.96875 (one ulp of 1/32 down: bits -1)
    new = bf16(1.0078125, 0.5, -2.015625, -0.0, 3.0, 6.96875)
    idx, zigzag = patch_of(old, new)
    assert idx.tolist() == [0, 2, 3, 5]
    assert zigzag.tolist() == [2, 2, 65535, 1]  # zigzag: +1 -> 2, -1 -> 1, -32768 -> 65535
    assert (np.diff(idx.numpy(), prepend=-1) - 1).tolist() == [0, 1, 0, 1]  # the gaps that travel


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_every_version_rebuilds_the_view_bit_exactly(dtype):
    torch.manual_seed(0)
    weights = {"w": torch.randn(300, 70) * 0.02, "b": torch.randn(513), "norm": torch.ones(64)}
    weights["b"][:3] = torch.tensor([float("nan"), float("inf"), -0.0])  # any bits survive
    pub = Publisher(PublishConfig(view="float32" if dtype == torch.float32 else "bfloat16", keyframe_bytes=100),
                    dtype)
    held = None
    for v in range(6):
        step = 1e-6 if v % 2 else 3e-3  # tiny RL steps and large ones (many ulps, sign flips)
        weights = {k: t + step * torch.randn_like(t) for k, t in weights.items()}
        enc = pub.publish(weights, v)
        enc2, _ = decode_version(encode_version(enc, "m", "c", {}))  # through the wire format
        held = apply_version(held, enc2)
        assert torch.equal(held.view(torch.int16 if dtype == BF16 else torch.int32),
                           make_view(weights, dtype).view(torch.int16 if dtype == BF16 else torch.int32))
        assert (enc.base is None) == (v == 0)
    tensors = pub.layout.tensors(held)
    assert tensors["w"].shape == (300, 70) and tensors["norm"].dtype == dtype


def test_byte_planes_round_trip_and_drop_empty_high_bytes():
    values = np.array([0, 1, 255, 256, 70000], dtype=np.uint64)
    data, planes = pack_planes(values, 3)
    assert planes == 3  # 70000 < 2^24
    assert unpack_planes(data, planes, values.size).tolist() == values.tolist()
    with pytest.raises(ValueError):
        unpack_planes(data, planes, values.size + 1)


def test_keyframes_come_on_schedule_and_when_patches_add_up_to_one():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(10_000, generator=gen) * 0.02

    def moved(v: int, share: float) -> dict[str, torch.Tensor]:  # `share` of the elements take a step
        picked = torch.rand(w.shape, generator=gen) < share
        return {"w": w + v * 1e-3 * picked}

    pub = Publisher(PublishConfig(view="float32", keyframe_every=3, keyframe_bytes=1e9), torch.float32)
    kinds = [pub.publish(moved(v, 0.01), v).base is None for v in range(8)]
    assert kinds == [True, False, False, True, False, False, True, False]  # every 3rd version
    # patches of a fifth of a keyframe each: a keyframe once they add up to one
    pub = Publisher(PublishConfig(view="float32", keyframe_every=100, keyframe_bytes=1.0), torch.float32)
    encs = [pub.publish(moved(v, 0.2), v) for v in range(12)]
    since, keyframe = 0, None
    for enc in encs:
        due = keyframe is None or since >= keyframe
        assert (enc.base is None) == due, f"v{enc.version}: {since} patch bytes since a keyframe of {keyframe}"
        since, keyframe = (0, enc.nbytes()) if enc.base is None else (since + enc.nbytes(), keyframe)
    kinds = [e.base is None for e in encs]
    assert kinds[0] and kinds.count(True) >= 2 and not kinds[1]


def keyframe_bytes_of(view: torch.Tensor) -> int:
    return len(encode_keyframe(view, PublishConfig().zstd_level)[0])


def test_a_patch_no_smaller_than_a_keyframe_goes_out_as_a_keyframe_and_the_metrics_say_so():
    gen = torch.Generator().manual_seed(0)
    n = 50_000
    w = torch.randn(n, generator=gen) * 0.02
    pub = Publisher(PublishConfig(view="float32", keyframe_every=100, keyframe_bytes=100), torch.float32)
    sent = [pub.publish({"w": w}, 0)]
    # the demo's case: a float32 view at a high lr, every element moves, and the patch still wins
    w = w + 1e-4 * torch.randn(n, generator=gen)
    sent.append(pub.publish({"w": w}, 1))
    p1 = sent[-1]
    assert p1.base == 0 and p1.stats["weights_kind"] == "patch" and p1.stats["weights_changed_frac"] > 0.99
    assert p1.nbytes() < keyframe_bytes_of(pub.published), (p1.nbytes(), keyframe_bytes_of(pub.published))
    assert p1.stats["weights_bytes_vs_view"] == p1.nbytes() / (4 * n) < 1
    assert p1.stats["weights_bytes_vs_bf16"] == p1.nbytes() / (2 * n)
    # every element moves to a view far simpler than the move (weights rounded to a grid of 1/64):
    # the patch would code n arbitrary steps, the keyframe n values of a few bits each
    held = pub.published
    grid = torch.round(w * 64) / 64
    positions, values, count = encode_patch(held, make_view({"w": grid}, torch.float32))
    assert count == n
    sent.append(pub.publish({"w": grid}, 2))
    k2 = sent[-1]
    assert k2.base is None and k2.count == n, "a patch larger than a keyframe was published"
    assert k2.nbytes() < len(positions) + len(values), (k2.nbytes(), len(positions) + len(values))
    stats = k2.stats
    assert (stats["weights_kind"], stats["weights_keyframe"], stats["weights_changed_frac"]) == ("keyframe", True, 1.0)
    assert k2.stats["weights_bytes_vs_view"] == k2.nbytes() / (4 * n)
    # patches go on from the new keyframe
    sent.append(pub.publish({"w": torch.where(torch.rand(n, generator=gen) < 0.01, grid + 1 / 64, grid)}, 3))
    assert sent[-1].base == 2 and sent[-1].stats["weights_kind"] == "patch", sent[-1].stats
    # a sampler rebuilds the chain across the unscheduled keyframe bit for bit (digest-checked)
    views = []
    for enc in sent:
        enc, _ = decode_version(encode_version(enc, "m", "c", {}))
        views.append(apply_version(views[-1] if views and enc.base is not None else None, enc))
    assert torch.equal(views[1].view(torch.int32), held.view(torch.int32))
    assert torch.equal(views[-1].view(torch.int32), pub.published.view(torch.int32))


def test_a_bfloat16_view_compares_with_a_bfloat16_copy():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(20_000, generator=gen) * 0.02
    pub = Publisher(PublishConfig(view="bfloat16"), BF16)
    pub.publish({"w": w}, 0)
    enc = pub.publish({"w": w + 1e-5 * torch.randn(w.shape, generator=gen)}, 1)
    assert enc.base == 0 and enc.stats["weights_bytes_vs_view"] == enc.stats["weights_bytes_vs_bf16"] < 0.5


def test_a_patch_to_the_wrong_base_or_a_tampered_one_is_refused():
    gen = torch.Generator().manual_seed(0)
    w0 = {"w": torch.randn(4096, generator=gen) * 0.02}
    pub = Publisher(PublishConfig(view="bfloat16"), BF16)
    k0 = pub.publish(w0, 0)
    p1 = pub.publish({"w": w0["w"] + 1e-4 * torch.randn(4096, generator=gen)}, 1)
    held = apply_version(None, k0)
    wrong = held.clone()
    wrong[7] = 1.0
    with pytest.raises(ValueError, match="digest"):
        apply_version(wrong, p1)
    for bad in (dict(count=5000), dict(count=p1.count + 1)):
        with pytest.raises(ValueError):
            apply_version(held, EncodedVersion(**{**p1.__dict__, **bad}))
    far = entropy.encode(np.array([5000], dtype=np.uint64), [1], GAP_ESCAPE)  # a gap that skips past the end
    one = entropy.encode(np.array([2], dtype=np.uint64), [1], STEP_ESCAPE)
    with pytest.raises(ValueError, match="past"):
        apply_version(held, EncodedVersion(**{**p1.__dict__, "count": 1, "positions": far, "values": one}))
    assert torch.equal(apply_version(held, p1), pub.published)


def test_publish_cadence():
    cfg = PublishConfig(every_steps=2, min_interval_s=1.0, max_upload_mbit_s=8.0)
    assert not publish_due(cfg, 1, 10.0, 0)  # one step only
    assert not publish_due(cfg, 2, 0.5, 0)  # too soon
    assert publish_due(cfg, 2, 1.0, 1_000_000)  # 8 Mbit at 8 Mbit/s: 1 s
    assert not publish_due(cfg, 2, 1.5, 2_000_000)  # 16 Mbit needs 2 s
    assert publish_due(PublishConfig(), 1, 0.0, 10**9)
    assert PublishConfig().view_dtype("cpu") == torch.float32 and PublishConfig(view="auto").view_dtype("cuda") == BF16
    with pytest.raises(ValueError):
        PublishConfig(view="int8")


def test_rl_sized_patches_are_within_a_few_percent_of_the_entropy_bound():
    """An Adam-like step of lr 1e-6 on N(0, 0.02) weights flips ~4% of the bfloat16 view. The patch
    must come within 1.15x of the entropy of what changed (positions and steps)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(2_000_000, generator=gen) * 0.02
    old = w.to(BF16)
    new = (w + 1e-6 * torch.sign(torch.randn(w.shape, generator=gen))).to(BF16)
    pub = Publisher(PublishConfig(view="bfloat16"), BF16)
    pub.publish({"w": w}, 0)
    enc = pub.publish({"w": new.float()}, 1)  # new is exactly representable: the view is `new`
    bound = entropy_bound_bytes(old, new)
    changed = enc.count / w.numel()
    assert 0.03 < changed < 0.06
    assert bound < enc.nbytes() < 1.15 * bound
    # the bound by hand, from the bit patterns: n H(p) for which changed, c H(steps) for by how much
    ob, nb = old.view(torch.int16).numpy().astype(np.int64), new.view(torch.int16).numpy().astype(np.int64)
    moved = ob != nb
    steps = ((nb[moved] - ob[moved] + 32768) & 0xFFFF) - 32768
    q = np.unique(steps, return_counts=True)[1] / moved.sum()
    h = -(changed * math.log2(changed) + (1 - changed) * math.log2(1 - changed))
    assert bound == pytest.approx((w.numel() * h + moved.sum() * -(q * np.log2(q)).sum()) / 8, rel=1e-9)


def test_layout_splits_the_flat_view_without_copies():
    weights = {"a": torch.arange(6.0).view(2, 3), "b": torch.tensor([7.0])}
    flat = make_view(weights, torch.float32)
    layout = Layout.of(weights)
    t = layout.tensors(flat)
    assert t["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and t["b"].tolist() == [7.0]
    assert t["a"].data_ptr() == flat.data_ptr() and layout.numel == 7


def test_a_decoded_version_views_its_blob_and_a_blob_whose_tensors_lie_outside_it_is_refused():
    import json
    import struct

    w = {"w": torch.arange(1000, dtype=torch.float32) / 7}
    enc = Publisher(PublishConfig(view="bfloat16"), torch.bfloat16).publish(w, 0)
    blob = encode_version(enc, "m", "c", {})
    got, _ = decode_version(blob)
    assert isinstance(got.values, memoryview) and got.values.obj is blob  # a view of the blob, no copy
    assert bytes(got.values) == enc.values and bytes(got.positions) == enc.positions
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])

    def with_header(h: dict) -> bytes:
        text = json.dumps(h).encode()
        return struct.pack("<Q", len(text)) + text + blob[8 + n :]

    past = {**header, "values": {**header["values"], "data_offsets": [0, len(blob)], "shape": [len(blob)]}}
    wide = {**header, "values": {**header["values"], "dtype": "F32"}}
    lying = {**header, "values": {**header["values"], "shape": [1]}}
    for bad in (with_header(past), with_header(wide), with_header(lying), blob[:8] + b"{not json" + blob[8 + n :]):
        with pytest.raises(ValueError):
            decode_version(bad)
