"""Checkable sampling: completions drawn with randomness the learner can reproduce, so a spot
audit can tell a sampled completion from a chosen one.

A sampler does not pick its own random numbers. Completion j of prompt `prompt_id`, made by
`sampler` with the weights of a published version, uses

    seed_j = H(nonce_v, prompt_id, sampler, j)        nonce_v = H(the version as published),
                                                       node/weights.py, version_nonce
    u_t    = H(seed_j, t) as a float in [0, 1)        one uniform per generated position t

and takes the token whose interval of the tempered, filtered CDF (vocabulary order) holds u_t:

    token_t = min { k : C_k > u_t },  C_k = sum_{i <= k} pi_i,  pi = filter(softmax(logits_t / T))

The nonce is the hash of what the learner published, so nobody (the learner included) knows
it before the version exists, and the sampler never chooses it (GRAIL's lesson: the prover must
not choose the challenge). Given the weights of version v, the completion is determined; a learner
holding those weights checks it with one forward pass (`audit_tokens`): every token's interval
must hold u_t, widened by `tol` on both sides for engine numerics (another kernel, another dtype
moves the CDF a little). A token a sampler chose instead passes a position only with probability
pi_token + 2 tol, so a chosen completion fails within a few deviating positions.

Greedy decoding (T = 0) is deterministic already: the token must be within `tol` (in logits) of
the argmax.
"""

from __future__ import annotations

import hashlib
import struct

import torch

SEED_BYTES = 16
"""Seeds and version nonces (node/weights.py, version_nonce) are this long."""



BASE_NONCE = b"\0" * SEED_BYTES
"""Nonce of the base model (chain "", version 0): a sampler that has not loaded any version."""


def completion_seed(nonce: bytes, prompt_id: str, sampler: str, index: int) -> bytes:
    h = hashlib.blake2b(nonce, digest_size=SEED_BYTES)
    for part in (prompt_id.encode(), sampler.encode()):
        h.update(len(part).to_bytes(4, "little") + part)
    h.update(index.to_bytes(4, "little"))
    return h.digest()


def group_seeds(nonce: bytes, prompt_id: str, sampler: str, n: int) -> list[bytes]:
    """The seeds of a group's n completions (what the sampler draws with and the auditor checks)."""
    return [completion_seed(nonce, prompt_id, sampler, j) for j in range(n)]


def uniforms(seed: bytes, n: int, start: int = 0) -> list[float]:
    """u_t for t in [start, start + n): 53 random bits of H(seed, t) each, in [0, 1)."""
    out = []
    for t in range(start, start + n):
        d = hashlib.blake2b(seed + t.to_bytes(4, "little"), digest_size=8).digest()
        out.append((struct.unpack("<Q", d)[0] >> 11) * 2.0**-53)
    return out


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """pi = filter(softmax(logits / T)) in float64, renormalised over the kept tokens; [..., V]."""
    x = logits.double() / temperature
    if top_k and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -torch.inf)
    p = torch.softmax(x, dim=-1)
    if top_p < 1.0:
        sorted_p, order = p.sort(dim=-1, descending=True)
        # drop a token when the tokens strictly more likely already reach top_p (the first always stays)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        p = p.masked_fill(drop, 0.0)
        p = p / p.sum(-1, keepdim=True)
    return p


def pick_tokens(logits: torch.Tensor, us: torch.Tensor, temperature: float, top_k: int = 0,
                top_p: float = 1.0) -> torch.Tensor:
    """The token each row's uniform selects: logits [N, V], us [N] -> [N] long (greedy if T = 0)."""
    if temperature == 0:
        return logits.argmax(-1)
    cdf = sampling_probs(logits, temperature, top_k, top_p).cumsum(-1)
    u = us.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]  # cdf[-1] is 1 up to rounding
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)


def miss_distances(logits: torch.Tensor, tokens: torch.Tensor, us: torch.Tensor, temperature: float,
                   top_k: int = 0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """How far each position's uniform lies outside its token's interval, and the room an engine's
    rounding has at that boundary: logits [N, V] (the auditor's, at the claimed version), tokens
    [N], us [N] -> (d, m), float64 [N] each.

    d = 0 where u_t lies in [C_{k-1}, C_k), else the distance (CDF units) to the nearer boundary B;
    inf for a filtered-out token (pi = 0). m = min(B, 1 - B) at that boundary. Why m: another
    engine computes logits z + e (bfloat16, other kernels); to first order its CDF moves by
        dC_k = sum_{i <= k} pi_i (e_i - ebar) / T = -sum_{i > k} pi_i (e_i - ebar) / T,  ebar = sum_j pi_j e_j
    so |dC_k| <= min(C_k, 1 - C_k) * range(e) / T. An honest sampler misses only where u_t falls
    between its boundary and ours, so d <= m * range(e) / T; a chosen token misses by the mass
    between u_t and its interval, which near a confident token's boundary (m small) is far more.
    Greedy (T = 0): d is how far the token's logit is below the top one (in logits), m = 1."""
    tokens = tokens.to(logits.device)
    if temperature == 0:
        top = logits.double().max(-1).values
        d = (top - logits.double().gather(-1, tokens[:, None]).squeeze(-1)).clamp(min=0)
        return d, torch.ones_like(d)
    p = sampling_probs(logits, temperature, top_k, top_p)
    cdf = p.cumsum(-1)  # [N, V] float64: no further full-vocabulary temporaries (chunks are sized for one)
    hi = cdf.gather(-1, tokens[:, None]).squeeze(-1) / cdf[:, -1]
    p_tok = p.gather(-1, tokens[:, None]).squeeze(-1) / cdf[:, -1]
    lo = hi - p_tok
    u = us.to(cdf.device, torch.float64)
    d = torch.maximum(lo - u, u - hi).clamp(min=0)  # u == hi (measure zero) counts as inside
    boundary = torch.where(u < lo, lo, hi)
    m = torch.minimum(boundary, 1 - boundary).clamp(min=0)
    return torch.where(p_tok > 0, d, torch.inf), m


def within_tolerance(d: torch.Tensor, m: torch.Tensor, tol: float, rel_tol: float = 0.0) -> torch.Tensor:
    """The audit's rule per position: d <= tol + rel_tol * m (d, m of `miss_distances`). `tol`
    absorbs float32 engines' differences (~1e-6); `rel_tol` bounds another engine's logit error
    range over T (bfloat16: examples/bench_bf16_audit.py)."""
    return d <= tol + rel_tol * m


def audit_tokens(logits: torch.Tensor, tokens: torch.Tensor, us: torch.Tensor, temperature: float,
                 top_k: int = 0, top_p: float = 1.0, tol: float = 1e-3) -> torch.Tensor:
    """Which positions hold a token the randomness selects: logits [N, V] (the auditor's, at the
    claimed version), tokens [N], us [N] -> bool [N]. An interval [C_{k-1}, C_k) of token k is
    widened by `tol` on both sides; a filtered-out token (pi = 0) never passes."""
    return within_tolerance(miss_distances(logits, tokens, us, temperature, top_k, top_p)[0], 0.0, tol)
