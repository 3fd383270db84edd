"""Tolerances derived from floating-point rounding, for tests that compare two computations.

A tolerance tuned on one CPU fails on another (issue 25): float32 sums come out in another order
under other kernels. So a test either computes both sides in float64, where reordering moves a
result by ~1e-15 relative, or takes its tolerance from a rounding bound like the one below.
"""

from __future__ import annotations

import math

import torch

U32 = 2.0**-24
"""Unit roundoff of float32: one rounding moves a value x by at most U32 |x|."""


def float32_logprob_tol(logits: torch.Tensor, temperature: float, logprobs: list[float]) -> float:
    """Bound on |l32 - l| for l = log softmax(z / T)[token] computed exactly (float64) and l32 the
    same formula in float32, as the HF engine records it (transformers hands its logits processor
    float32 scores): with X = max |z| / T over `logits` [N, V] and L = max |l| over `logprobs`,

        z and z / T rounded                   each x = z / T off by <= 2 U X: l by <= 4 U X
        y = x - max x rounded (|y| <= 2 X)    l by <= 4 U X
        V exps (1 ulp) summed, all <= 1       log sum by <= (V + 1) U  (Higham, ch. 4)
        log (1 ulp) of a sum in [1, V]        <= 2 U ln V
        l = y - log sum rounded               <= U L

    The float64 side's own rounding (a KV-cache forward against a whole one) is ~1e-15: negligible.
    """
    x = float(logits.abs().max()) / temperature
    v = logits.shape[-1]
    return U32 * (8 * x + v + 1 + 2 * math.log(v) + max((abs(lp) for lp in logprobs), default=0.0))
