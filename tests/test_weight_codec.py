"""Keyframes and deltas: bit-exact reconstruction through any chain, error feedback, codec sizes."""

import pytest
import torch

from node.models import BUILTIN_MODEL, load_model
from node.weight_codec import CODECS, CodecConfig, Publisher, apply_version, decode_tensor, encode_tensor


def test_int8_blockwise_hand_values_and_error_bound():
    x = torch.tensor([0.0, 1.27, -2.54, 0.5, 3.0])
    parts = encode_tensor(x, "int8", block=3, topk_frac=1.0)
    assert parts["scale"].tolist() == pytest.approx([2.54 / 127, 3.0 / 127])
    assert parts["q"].tolist() == [0, 64, -127, 21, 127]  # 1.27 / 0.02 = 63.5 rounds to 64
    back = decode_tensor(parts, "int8", 3, (5,))
    assert (back - x).abs().max() <= 3.0 / 127 / 2 + 1e-6
    zeros = decode_tensor(encode_tensor(torch.zeros(4), "int8", 2, 1.0), "int8", 2, (4,))
    assert torch.equal(zeros, torch.zeros(4))  # all-zero blocks: scale 0, no NaN


def test_topk_keeps_only_the_largest_entries():
    x = torch.tensor([0.1, -5.0, 0.2, 4.0, -0.3, 0.0])
    parts = encode_tensor(x, "topk_int8", block=256, topk_frac=0.34)  # ceil(2.04) = 3 entries
    assert parts["idx"].tolist() == [1, 3, 4]
    back = decode_tensor(parts, "topk_int8", 256, (6,))
    assert back[[0, 2, 5]].tolist() == [0, 0, 0] and back[1] == pytest.approx(-5.0, abs=0.03)


def random_walk(steps, seed=0, scale=1e-3):
    g = torch.Generator().manual_seed(seed)
    w = {"a": torch.randn(64, 33, generator=g), "b": torch.randn(7, generator=g)}
    for _ in range(steps):
        w = {k: v + scale * torch.randn(v.shape, generator=g) for k, v in w.items()}
        yield w


@pytest.mark.parametrize("codec", CODECS)
def test_samplers_reconstruct_the_published_weights_bit_exactly_through_any_chain(codec):
    pub = Publisher(CodecConfig(codec=codec, keyframe_every=7, block=32, topk_frac=0.1))
    sampler, have = None, None
    for v, true in enumerate(random_walk(20), start=1):
        enc = pub.publish(true, v)
        assert (enc.base is None) == (v == 1 or v % 7 == 0)
        assert enc.base is None or enc.base == have
        sampler = apply_version(sampler, enc)
        have = v
        assert all(torch.equal(sampler[k], pub.published[k]) for k in sampler)


@pytest.mark.parametrize("codec", ["int8", "topk_int8"])
def test_error_feedback_keeps_published_close_to_true(codec):
    """With feedback the published copy's error stays at about one step's quantisation error; a
    codec that encodes true_v - true_{v-1} instead (no feedback) drifts further and further."""
    cfg = CodecConfig(codec=codec, keyframe_every=10_000, block=64, topk_frac=0.2)
    pub = Publisher(cfg)
    drift, prev_true, fb_err, nofb_err = None, None, [], []
    for v, true in enumerate(random_walk(80, scale=1e-2), start=1):
        pub.publish(true, v)
        if prev_true is None:
            drift = {k: t.clone() for k, t in true.items()}
        else:
            for k in true:
                parts = encode_tensor(true[k] - prev_true[k], codec, cfg.block, cfg.topk_frac)
                drift[k] = drift[k] + decode_tensor(parts, codec, cfg.block, tuple(true[k].shape))
        prev_true = true
        fb_err.append(max((true[k] - pub.published[k]).abs().max().item() for k in true))
        nofb_err.append(max((true[k] - drift[k]).abs().max().item() for k in true))
    assert fb_err[-1] < 4 * max(fb_err[1:10])  # bounded
    assert nofb_err[-1] > 3 * fb_err[-1]  # without feedback the error accumulates


def test_a_late_sampler_catches_up_from_the_last_keyframe():
    pub = Publisher(CodecConfig(codec="int8", keyframe_every=5))
    encoded = [pub.publish(true, v) for v, true in enumerate(random_walk(12), start=1)]
    last_key = max(e.version for e in encoded if e.base is None)
    late = None
    for e in encoded:
        if e.version >= last_key:
            late = apply_version(late, e)
    assert all(torch.equal(late[k], pub.published[k]) for k in late)
    with pytest.raises(ValueError, match="needs base"):
        apply_version(None, encoded[-1])


def test_bytes_per_version_on_the_builtin_model():
    sd = {k: v for k, v in load_model(BUILTIN_MODEL).state_dict().items()}
    full_bf16 = sum(v.numel() * 2 for v in sd.values())
    sizes = {}
    for codec in CODECS:
        pub = Publisher(CodecConfig(codec=codec, keyframe_every=1000, topk_frac=0.05))
        pub.publish(sd, 1)
        moved = {k: v + 1e-4 * torch.randn_like(v) for k, v in sd.items()}
        sizes[codec] = pub.publish(moved, 2).nbytes() / full_bf16
    assert sizes["fp32"] == pytest.approx(2.0, rel=0.01) and sizes["bf16"] == pytest.approx(1.0, rel=0.01)
    assert 0.5 < sizes["int8"] < 0.52  # 1 byte per value + a 4-byte scale per 256
    assert sizes["topk_int8"] < 0.2
