"""GEPO's Theorem 1, numerically: group-expectation weights p/E_hat vs plain importance weights p/q.

    python examples/gepo_variance.py

Behaviour q and learner p are distributions over K sequences, q = softmax(z) and
p = softmax(z + delta * noise); growing delta grows KL(p||q). For each of `pairs` random (z, noise)
draws we sample groups of G sequences from q and measure Var[p(y)/q(y)] and Var[p(y)/E_hat] with
E_hat = sum_j q_j^2 / sum_j q_j over the group, as `node.algorithms.gepo.gepo_log_weights` (the
loss's own code) computes them. The table gives medians
over the pairs and the share of pairs where GEPO's weights have the lower variance.

What it shows: Var[p/q] is the chi-square divergence, >= exp(KL) - 1, so it explodes with KL;
Var[p/E_hat] ~ Var_q[p] / E_q[q]^2 stays bounded. Near on-policy, plain IS is the *lower*-variance
one (p/q ~ 1 while E_hat still fluctuates); GEPO wins more often and by more as KL grows.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.algorithms.gepo import gepo_log_weights  # noqa: E402


def _one_pair(delta: float, K: int, G: int, samples: int, gen: torch.Generator) -> tuple[float, float, float]:
    z = 2 * torch.randn(K, generator=gen, dtype=torch.float64)
    noise = torch.randn(K, generator=gen, dtype=torch.float64)
    lq, lp = torch.log_softmax(z, -1), torch.log_softmax(z + delta * noise, -1)
    n_groups = samples // G
    y = torch.multinomial(lq.exp(), n_groups * G, replacement=True, generator=gen)
    gid = torch.arange(n_groups).repeat_interleave(G)
    # each sampled sequence as a one-token completion: the loss's own weights, E_hat and all
    one = torch.ones(len(y), 1, dtype=torch.bool)
    log_w = gepo_log_weights(lp[y][:, None], lq[y][:, None], one, gid)
    kl = (lp.exp() * (lp - lq)).sum().item()
    return kl, torch.exp(lp[y] - lq[y]).var().item(), torch.exp(log_w).var().item()


def variance_table(deltas=(0.5, 1.0, 2.0, 4.0, 6.0), K: int = 512, G: int = 8, samples: int = 16_000,
                   pairs: int = 20, seed: int = 0) -> list[dict[str, float]]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for delta in deltas:
        runs = [_one_pair(delta, K, G, samples, gen) for _ in range(pairs)]
        ratios = [v_is / v_ge for _, v_is, v_ge in runs]
        rows.append({
            "delta": delta,
            "kl": statistics.median(r[0] for r in runs),
            "var_is": statistics.median(r[1] for r in runs),
            "var_gepo": statistics.median(r[2] for r in runs),
            "ratio": statistics.median(ratios),
            "gepo_wins": sum(r > 1 for r in ratios) / pairs,
        })
    return rows


def format_table(rows: list[dict[str, float]]) -> str:
    lines = [f"{'KL(p||q)':>9} {'Var[p/q]':>10} {'Var[p/E_hat]':>13} {'ratio':>9} {'GEPO lower':>11}"]
    lines += [f"{r['kl']:9.3f} {r['var_is']:10.4g} {r['var_gepo']:13.4g} {r['ratio']:9.3g} {r['gepo_wins']:10.0%}"
              for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print("medians over 20 random (p, q) pairs per row, K = 512 sequences, groups of G = 8")
    print(format_table(variance_table()))
