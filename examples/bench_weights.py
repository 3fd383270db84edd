"""Bytes per version and policy drift of each weight codec, side by side.

    python examples/bench_weights.py            # tiny model (real learner steps) + a 0.5B Qwen3-shaped model
    python examples/bench_weights.py --no-large

For each codec, a Publisher sends a keyframe and then one delta per learner step; we report the
delta's bytes relative to a full bf16 checkpoint of the model, and the drift that codec leaves
between the learner's true weights and the published ones samplers hold: the mean per-token
KL(true || published) of next-token distributions on held-out text.
  * tiny: the built-in model after 10 real GEPO steps on-policy (its real update sizes);
  * 0.5B: a Qwen3-architecture model with random weights made locally (hidden 896, 24 layers,
    vocab 151936, like Qwen2.5-0.5B), updated by Adam-sized steps (1e-5 x N(0, 1) per entry);
    drift measured on random token sequences.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.weight_codec import CODECS, CodecConfig, Publisher  # noqa: E402
from node.weights import encode_version, untie  # noqa: E402


def kl_true_published(model, true_sd, published, input_ids) -> float:
    with torch.no_grad():
        model.load_state_dict(true_sd, strict=False)
        lp = torch.log_softmax(model(input_ids=input_ids).logits.float(), -1)
        model.load_state_dict(published, strict=False)
        lq = torch.log_softmax(model(input_ids=input_ids).logits.float(), -1)
        model.load_state_dict(true_sd, strict=False)
    return (lp.exp() * (lp - lq)).sum(-1).mean().item()


def run(model, versions: list[dict], input_ids, name: str) -> None:
    weights0, aliases = untie(model.state_dict())
    full_bf16 = sum(t.numel() * 2 for t in weights0.values())
    print(f"\n{name}: {sum(t.numel() for t in weights0.values()) / 1e6:.1f}M parameters, "
          f"full bf16 checkpoint {full_bf16 / 1e6:.1f} MB, {len(versions) - 1} deltas")
    print(f"{'codec':10} {'delta bytes':>12} {'vs bf16':>8} {'KL(true||published)':>20} {'encode s':>9}")
    for codec in CODECS:
        pub = Publisher(CodecConfig(codec=codec, keyframe_every=10_000))
        sizes, t0 = [], time.time()
        for v, sd in enumerate(versions):
            blob = encode_version(pub.publish(sd, v), "bench", "c", aliases)
            if v:
                sizes.append(len(blob))
        secs = (time.time() - t0) / len(versions)
        kl = kl_true_published(model, versions[-1], pub.published, input_ids)
        mean = sum(sizes) / len(sizes)
        print(f"{codec:10} {mean / 1e6:10.2f}MB {mean / full_bf16:8.3f} {kl:20.2e} {secs:9.2f}")


def tiny() -> None:
    from node.learner import LearnerConfig
    from node.models import BUILTIN_MODEL, load_model, load_tokenizer
    from cli.simulate import Simulator, SimulatorConfig

    sim = Simulator(SimulatorConfig(learner=LearnerConfig(eval_every=0), steps=10))
    snapshots = [{k: v.clone() for k, v in untie(sim.learner.model.state_dict())[0].items()}]
    sim.run(lambda r: r["kind"] == "step" and snapshots.append(
        {k: v.clone() for k, v in untie(sim.learner.model.state_dict())[0].items()}))
    tok = load_tokenizer(BUILTIN_MODEL)
    texts = [p.prompt + p.answer for p in list(sim.task.split("eval"))[:128]]
    ids = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)["input_ids"]
    run(load_model(BUILTIN_MODEL), snapshots, ids, "built-in tiny model, 10 real GEPO steps")


def large() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg).eval()
    w, _ = untie(model.state_dict())
    gen = torch.Generator().manual_seed(1)
    versions = [w]
    for _ in range(2):
        versions.append({k: t + 1e-5 * torch.randn(t.shape, generator=gen) for k, t in versions[-1].items()})
    ids = torch.randint(0, cfg.vocab_size, (4, 32), generator=gen)
    run(model, versions, ids, "Qwen3-shaped random model")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-large", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    tiny()
    if not args.no_large:
        large()
