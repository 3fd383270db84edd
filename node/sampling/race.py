"""Checkable sampling: completions drawn with randomness the learner can reproduce, so a spot
audit can tell a sampled completion from a chosen one, whatever precision and kernels the
sampler's GPU computes in.

A sampler does not pick its own random numbers. Completion j of prompt `prompt_id`, made by
`sampler` with the weights of a published version, uses

    seed_j = H(nonce_v, prompt_id, sampler, j)     nonce_v = H(the version as published),
                                                    node/weights/blob.py, version_nonce
    key_t  = H(seed_j, t)                           four 32-bit words per generated position t

and picks its token by a seeded race (Gumbel-max, in two levels over fixed chunks of CHUNK tokens
of the vocabulary):

    x_k    = z_k / T (the tempered logits; -inf where top-k / top-p filter token k out)
    c*     = argmax_c  logsumexp_{k in chunk c} x_k + G(key_t, c)      which chunk
    token  = argmax_{k in c*}  x_k + g(key_t, k)                        which token of it

with G, g standard Gumbel noise, -log(-log u), u a 32-bit hash of (key, index) computed with
integer tensor operations that are exact (no overflow, no float) and so give the same bits on
every device and batch shape. P(c*) is chunk c's share of the probability and P(token | c*) the
token's share of its chunk, so the token is drawn from softmax(x) exactly (to the 2^-32
resolution of u). Two levels keep the noise cheap at a 151k vocabulary: the sampler hashes one
number per chunk and CHUNK numbers of one chunk per position, not one per token; the logsumexp
per chunk costs what softmax sampling's exp pass does.

Why a race and not the inverse CDF (protocol 1): a CDF boundary sums every token below it, so
another engine's logit error e moved it by up to min(C, 1 - C) x range(e) / T, and the error an
audit had to absorb grew with the vocabulary (bfloat16 samplers missed 17-19% of their intervals
on a 32k vocabulary). Here the decision compares two scores: the winner's and the runner-up's.
Another engine's error moves each by at most max |e| / T (a chunk's logsumexp is a weighted mean
of its tokens' errors), so an honest sampler's token is at most ~2 max |e| (in logits) short of
the auditor's best, whatever the vocabulary.

The nonce is the hash of what the learner published, so nobody (the learner included) knows it
before the version exists, and the sampler never chooses it (GRAIL's lesson: the prover must not
choose the challenge). Given the weights of version v the completion is determined; the learner
checks it with one forward pass (`race_margins`): at each position, how far (in logits) the
claimed token's score is below the best one, at the chunk level and within its chunk. An honest
engine's margins are its numerics; a chosen token's margin is the gap a race left it, which
exceeds any tolerance at most positions (node/audit/margins.py, node/audit/auditor.py).

Top-k and top-p are decisions on the logits too, at the edge of the kept set: a token the
sampler's engine kept by a hair can fall outside the auditor's set, and a token the auditor keeps
by a hair (whose Gumbel noise may put it far ahead) may never have been in the sampler's race. So
the audit runs the race over the filters as an engine within its tolerance m could have applied
them (`node.sampling.filter_edges.admitted`): the claimed token counts as kept if some error of at most m/2
per logit keeps it, and a competitor counts only if every such error keeps it. Without this, honest bfloat16
samplers at top-p 0.95 / top-k 20 were refused for a boundary token in their first audits.

Greedy decoding (T = 0) is deterministic already: the margin is how far the token's logit is
below the top one.
"""

from __future__ import annotations

import hashlib
import struct

import torch

from node.sampling.filter_edges import admitted
from node.training.logprobs import logprobs_from_logits

SEED_BYTES = 16
"""Seeds and version nonces (node/weights/blob.py, version_nonce) are this long."""

BASE_NONCE = b"\0" * SEED_BYTES
"""Nonce of the base model (chain "", version 0): a sampler that has not loaded any version."""

CHUNK = 1024
"""Tokens per chunk of the race's first level (part of the protocol: sampler and auditor must
split the vocabulary alike). 1,024 makes both levels small at a 151,936-token vocabulary (149
chunks, then 1,024 tokens) and leaves a small model's vocabulary one chunk."""

KEY_WORDS = 4
"""32-bit words of key_t: (a, b) seed the chunk level's hash, (c, d) the token level's."""

_M32 = 0xFFFFFFFF


def completion_seed(nonce: bytes, prompt_id: str, sampler: str, index: int) -> bytes:
    h = hashlib.blake2b(nonce, digest_size=SEED_BYTES)
    for part in (prompt_id.encode(), sampler.encode()):
        h.update(len(part).to_bytes(4, "little") + part)
    h.update(index.to_bytes(4, "little"))
    return h.digest()


def group_seeds(nonce: bytes, prompt_id: str, sampler: str, n: int) -> list[bytes]:
    """The seeds of a group's n completions (what the sampler draws with and the auditor checks)."""
    return [completion_seed(nonce, prompt_id, sampler, j) for j in range(n)]


def position_keys(seed: bytes, n: int, start: int = 0) -> list[list[int]]:
    """key_t for t in [start, start + n): KEY_WORDS 32-bit words of H(seed, t) each."""
    words = struct.Struct(f"<{KEY_WORDS}I")
    return [list(words.unpack(hashlib.blake2b(seed + t.to_bytes(4, "little"), digest_size=4 * KEY_WORDS).digest()))
            for t in range(start, start + n)]


def keys_tensor(rows: list[list[int]], device: torch.device | str = "cpu") -> torch.Tensor:
    """Keys as an int64 [N, KEY_WORDS] tensor (each word < 2^32) on `device`."""
    return torch.tensor(rows, dtype=torch.int64, device=device).reshape(-1, KEY_WORDS)


KEY_BLOCK = 64
"""Positions an engine derives keys for at once (`PositionKeys`): one host-to-device copy per block
of steps instead of one per generated token, which would wait for the GPU each time."""


def key_block(seeds: list[bytes], start: int, n: int = KEY_BLOCK, device: torch.device | str = "cpu") -> torch.Tensor:
    """key_t of every seed for t in [start, start + n): int64 [len(seeds), n, KEY_WORDS] on `device`."""
    return keys_tensor([k for seed in seeds for k in position_keys(seed, n, start)], device).reshape(len(seeds), n, KEY_WORDS)


class PositionKeys:
    """key_t of completions being generated (one per seed), for the engines: derived KEY_BLOCK
    positions at a time, never past `max_tokens` (a 6-token completion derives 6 keys, not 64),
    and kept on `device`."""

    def __init__(self, seeds: list[bytes], max_tokens: int, device: torch.device | str = "cpu") -> None:
        self.seeds, self.max_tokens, self.device = seeds, max_tokens, device
        self._start = 0
        self._block = torch.zeros(len(seeds), 0, KEY_WORDS, dtype=torch.int64)  # keys from position _start

    def at(self, t: int) -> torch.Tensor:
        """key_t of every completion: int64 [len(seeds), KEY_WORDS] on `device`."""
        if not self._start <= t < self._start + self._block.shape[1]:
            n = max(1, min(KEY_BLOCK, self.max_tokens - t))
            self._start, self._block = t, key_block(self.seeds, t, n, self.device)
        return self._block[:, t - self._start]


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for 0 <= x, c < 2^32, exact in int64: no product reaches 2^63 in size.
    c >= 2^31 multiplies by c - 2^32 instead (the same mod 2^32, and |c - 2^32| <= 2^31); the
    mask takes the low 32 bits of the two's complement. Two tensor operations either way."""
    return (x * (c if c < 2**31 else c - 2**32)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32): a bijection that spreads every input bit."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_uniform(a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """u(a, b, i) in (0, 1), float64: a, b [N, 1] words, index [..., M] (or [M]) -> [N, M]. The
    bits come from exact integer operations: the same on every device."""
    x = _mix32(_mix32(index ^ a) ^ b)
    return (x.double() + 0.5) * 2.0**-32


def gumbel(a: torch.Tensor, b: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise -log(-log u) of `hash_uniform`, float64 [N, M]. At most ~22.9 (u = 1 -
    2^-33): a chunk or token whose tempered logit is ~26 below the best cannot win, so the 32-bit
    resolution of u truncates the softmax only below probabilities of ~1e-11."""
    return -torch.log(-torch.log(hash_uniform(a, b, index)))


def tempered(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """x = logits / T in `dtype`, -inf where top-k / top-p filter the token out; [..., V]."""
    x = logits.to(dtype)
    x = x.div_(temperature) if x is not logits else x / temperature  # one copy of [N, V], not two
    if top_k and top_k < x.shape[-1]:
        kth = x.topk(top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -torch.inf)
    if top_p < 1.0:
        p = torch.softmax(x, dim=-1)
        sorted_p, order = p.sort(dim=-1, descending=True)
        # drop a token when the tokens strictly more likely already reach top_p (the first always stays)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), -torch.inf)
    return x


def filtering(top_k: int, top_p: float, vocab: int) -> bool:
    """Whether top-k or top-p can drop a token of a `vocab`-token row."""
    return bool(top_k and top_k < vocab) or top_p < 1.0


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """pi = softmax of the filtered, tempered logits in float64: the distribution the race draws from."""
    return torch.softmax(tempered(logits, temperature, top_k, top_p), dim=-1)


def _chunk_lse(x: torch.Tensor) -> torch.Tensor:
    """logsumexp of each CHUNK of x [N, V] (the last one shorter) -> [N, chunks]. The whole
    chunks are a strided view of x, not a padded copy: at a 151k vocabulary an auditor's rows of
    float64 are hundreds of MB, and the copy cost as much time as the sum."""
    n, v = x.shape
    full = v // CHUNK
    x = x.contiguous()
    lse = x.as_strided((n, full, CHUNK), (v, CHUNK, 1)).logsumexp(-1)
    if v % CHUNK:
        lse = torch.cat([lse, x[:, full * CHUNK:].logsumexp(-1, keepdim=True)], dim=-1)
    return lse


def chunk_scores(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """The race's first level: logsumexp of each chunk of x [N, V] plus its Gumbel noise ->
    float64 [N, chunks] (-inf for a chunk whose tokens are all filtered out)."""
    lse = _chunk_lse(x).double()
    return lse + _chunk_noise(keys, lse.shape[-1])


def _chunk_noise(keys: torch.Tensor, chunks: int) -> torch.Tensor:
    """G(key_t, c) for c < chunks: the first level's noise, float64 [N, chunks]."""
    return gumbel(keys[:, 0:1], keys[:, 1:2], torch.arange(chunks, device=keys.device))


def token_scores(x: torch.Tensor, keys: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """The race's second level within chunk[r] of each row r: x_k + g(key, k) -> float64 [N, CHUNK]
    (-inf past the vocabulary)."""
    index = chunk[:, None] * CHUNK + torch.arange(CHUNK, device=x.device)  # [N, CHUNK] token ids
    inside = index < x.shape[-1]
    xs = x.gather(-1, index.clamp(max=x.shape[-1] - 1)).double().masked_fill(~inside, -torch.inf)
    return xs + gumbel(keys[:, 2:3], keys[:, 3:4], index)


BLOCK_BYTES = 64 << 20
"""The race works on blocks of rows whose float64 [rows, V] copies take at most this: an
auditor's head chunk of a 151k vocabulary (node/training/logprobs.HEAD_CHUNK_BYTES, ~440 rows) would
otherwise make several copies of 0.5 GB at once. Blocks change no result: each row is its own race."""


PICK_BLOCK_BYTES = 128 << 20
"""The sampler's blocks (`pick_tokens`, float32 copies) on a GPU: all rows of an engine's batch of
up to ~220 at a 151k vocabulary in one race (with top-p, `tempered` and the processors hold ~8
such copies at once by a count of their temporaries, ~1 GB; not measured on a GPU). Each block is a fixed number of small tensor operations
(~100: the hash, the two levels), which a GPU pays per kernel launch whatever the block's size:
at 64 MiB of float64 a batch of 128 rows of a 151k vocabulary took three blocks, ~280 launches
per token. GPUs only: on a CPU an operation costs microseconds, and blocks of 64 MiB were faster
(examples/bench_picker.py: 140 against 240 ms per token for 128 rows of 151,936 on 2 cores,
measured before the log-prob came from the race's sums)."""


def _block_rows(vocab: int, budget: int | None = None, itemsize: int = 8) -> int:
    return max(1, (BLOCK_BYTES if budget is None else budget) // (itemsize * vocab))


def pick_tokens(logits: torch.Tensor, keys: torch.Tensor | None, temperature: float, top_k: int = 0,
                top_p: float = 1.0) -> torch.Tensor:
    """The token each row's race selects: logits [N, V], keys [N, KEY_WORDS] -> [N] long (greedy
    if T = 0). The sampler's side: scores in float32 (its logits' precision or better)."""
    return _pick(logits, keys, temperature, top_k, top_p, False)[0]


def pick_with_logprobs(logits: torch.Tensor, keys: torch.Tensor | None, temperature: float, top_k: int = 0,
                       top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """`pick_tokens`, and each picked token's behaviour log-prob: log softmax(logits / T)[token],
    unfiltered (T = 1 when greedy), float32 [N]; node.training.logprobs.logprobs_from_logits's value.

    Without top-k / top-p the race has computed every chunk's logsumexp already, and the row's is
    theirs: log p = x_token - logsumexp_c lse_c, with no second pass over the vocabulary. That
    pass (a log_softmax writing a [N, V] copy) cost the HF sampler more than the race itself:
    50 against 29 ms per token at 128 rows of 151,936 on a 2-core CPU. With filters the race's
    sums are of the filtered row, so the log-prob takes its own pass."""
    return _pick(logits, keys, temperature, top_k, top_p, True)


def _pick(logits: torch.Tensor, keys: torch.Tensor | None, temperature: float, top_k: int, top_p: float,
          logprobs: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    if temperature == 0:
        tokens = logits.argmax(-1)
        return tokens, logprobs_from_logits(logits, tokens, 1.0) if logprobs else None
    rows = _block_rows(logits.shape[-1], PICK_BLOCK_BYTES, 4) if logits.is_cuda else _block_rows(logits.shape[-1])
    if logits.shape[0] > rows:
        blocks = [_pick(logits[i : i + rows], keys[i : i + rows], temperature, top_k, top_p, logprobs)
                  for i in range(0, logits.shape[0], rows)]
        return torch.cat([b[0] for b in blocks]), torch.cat([b[1] for b in blocks]) if logprobs else None
    x = tempered(logits, temperature, top_k, top_p, torch.float32)
    keys = keys.to(x.device)
    lse = _chunk_lse(x)
    chunk = (lse.double() + _chunk_noise(keys, lse.shape[-1])).argmax(-1)
    tokens = chunk * CHUNK + token_scores(x, keys, chunk).argmax(-1)
    if not logprobs:
        return tokens, None
    if filtering(top_k, top_p, logits.shape[-1]):
        return tokens, logprobs_from_logits(logits, tokens, temperature)
    return tokens, x.gather(-1, tokens[:, None]).squeeze(-1) - lse.logsumexp(-1)


def race_margins(logits: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, temperature: float,
                 top_k: int = 0, top_p: float = 1.0, slack: float = 0.0) -> torch.Tensor:
    """The auditor's side: how far, in logits, each claimed token's race score is below the best,
    float64 [N] (0 where the race selects it). logits [N, V] (the auditor's, at the claimed
    version), tokens [N], keys [N, KEY_WORDS].

    margin = T x max(best chunk score - the token's chunk's, best score in that chunk - the
    token's): the larger of the two levels' shortfalls, in logit units so that one tolerance fits
    every temperature. Another engine whose logits differ from ours by e picked the token as its
    best, so its margin here is <= 2 max |e| at both levels. inf for a filtered-out token;
    greedy (T = 0): the token's logit below the top one.

    `slack` (logits; the audit's tolerance): top-k / top-p as an engine whose logits differ from
    ours by at most slack / 2 could have applied them (`admitted`): the claimed token is filtered
    out only if every such engine drops it, and a competitor races only if every such engine keeps
    it. 0: our filters exactly."""
    tokens = tokens.to(logits.device)
    filters = slack > 0 and temperature > 0 and filtering(top_k, top_p, logits.shape[-1])
    rows = _block_rows(logits.shape[-1]) // (4 if filters else 1) or 1  # `admitted` holds ~4 more [rows, V] copies
    if logits.shape[0] > rows:
        return torch.cat([race_margins(logits[i : i + rows], tokens[i : i + rows], keys[i : i + rows], temperature,
                                       top_k, top_p, slack) for i in range(0, logits.shape[0], rows)])
    if temperature == 0:
        z = logits.double()
        return (z.max(-1).values - z.gather(-1, tokens[:, None]).squeeze(-1)).clamp(min=0)
    keys = keys.to(logits.device)
    tok_chunk = tokens // CHUNK
    if filters:
        x = tempered(logits, temperature, dtype=torch.float64)
        h = slack / (2 * temperature)
        surely, possible = admitted(x, h, top_k, top_p)
        kept = possible.gather(-1, tokens[:, None]).squeeze(-1)
        # the claimed token's chunk weighs what it may have weighed for the sampler (all its
        # tokens some engine keeps), every other chunk what it surely weighed (those all keep)
        own = chunk_scores(x.masked_fill(~possible, -torch.inf), keys).gather(-1, tok_chunk[:, None])
        x = x.masked_fill(~surely.scatter(-1, tokens[:, None], True), -torch.inf)
        chunks = chunk_scores(x, keys).scatter(-1, tok_chunk[:, None], own)
    else:
        x = tempered(logits, temperature, top_k, top_p, torch.float64)
        chunks = chunk_scores(x, keys)
    at_chunk = chunks.max(-1).values - chunks.gather(-1, tok_chunk[:, None]).squeeze(-1)
    inner = token_scores(x, keys, tok_chunk)
    at_token = inner.max(-1).values - inner.gather(-1, (tokens % CHUNK)[:, None]).squeeze(-1)
    margin = temperature * torch.maximum(at_chunk, at_token)
    filtered = ~kept if filters else x.gather(-1, tokens[:, None]).squeeze(-1) == -torch.inf
    return torch.where(filtered, torch.inf, margin.clamp(min=0))


def within_tolerance(margins: torch.Tensor, tol: float) -> torch.Tensor:
    """The audit's rule per position: margin <= tol (logits; AuditConfig.margin)."""
    return margins <= tol


def audit_tokens(logits: torch.Tensor, tokens: torch.Tensor, keys: torch.Tensor, temperature: float,
                 top_k: int = 0, top_p: float = 1.0, tol: float = 1e-4) -> torch.Tensor:
    """Which positions hold a token the race selects, within `tol` logits (the filters too): bool [N]."""
    return within_tolerance(race_margins(logits, tokens, keys, temperature, top_k, top_p, slack=tol), tol)

