"""Spot audits of checkable sampling (node/checkable.py) and what a failed audit costs.

    archive = VersionArchive(window=64)          # the learner's own published versions
    archive.put(chain, version, enc, nonce, view)  # on every publish (the view: cached if it fits)
    model_v.load_state_dict(archive.weights(chain, v))
    results = audit_groups(model_v, items, params, pad_id, tol)   # one forward pass for v's groups

The learner rebuilds the weights a sampler held at version v from its own keyframes and patches
(bit-exact: the same `apply_version` the samplers run), loads them into an audit copy of the
model and checks that every token of an audited group is the one the seeded randomness selects.
A sampler whose audited group fails is refused for good: its buffered groups are dropped, its
credit is revoked, and the refusal is written to disk at once, so a restart keeps it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkable import BASE_NONCE, miss_distances, uniforms, within_tolerance
from .engines.base import SamplingParams
from .logprobs import completion_logits, logprobs_from_logits, pack
from .weight_codec import EncodedVersion, Layout, apply_version, make_view

log = logging.getLogger(__name__)


class VersionArchive:
    """The learner's published versions of the last `window` versions, as the encoded keyframes and
    patches it sent (plus the base model as chain "" version 0), rebuilt on demand."""

    KEEP = 4
    """Views kept whatever their size: a rebuild then starts from a recent one, not the keyframe."""

    def __init__(self, window: int, cache_bytes: int = 256 << 20) -> None:
        self.window = window
        self.cache_bytes = cache_bytes
        self.encoded: dict[tuple[str, int], EncodedVersion] = {}
        self.nonces: dict[tuple[str, int], bytes] = {("", 0): BASE_NONCE}
        self._base: tuple[Layout, torch.Tensor] | None = None
        self._cache: collections.OrderedDict[tuple[str, int], torch.Tensor] = collections.OrderedDict()
        """Flat views, newest use last, within `cache_bytes` (or the last `KEEP` used): the
        views the learner published, handed over as it publishes them, and those rebuilt lately. An
        audit of a cached version costs no decode; a rebuild starts from the nearest cached
        ancestor rather than from the keyframe. With a small model every version within the
        staleness samplers show fits (the demo's: 3.2 MB each); a 0.6B float32 view (2.4 GB) does
        not, and is rebuilt as before (the last `KEEP` rebuilt are kept, as before)."""

    def put_base(self, weights: dict[str, torch.Tensor]) -> None:
        """The weights every sampler starts from before it loads a version (chain "", version 0):
        kept as they are, in float32."""
        self._base = Layout.of(weights), make_view(weights, torch.float32).cpu()

    def put(self, chain: str, version: int, enc: EncodedVersion, nonce: bytes, view: torch.Tensor | None = None) -> None:
        """Archive a published version; `view`, the flat view it rebuilds (what the publisher
        encoded, never modified after), is cached on the CPU where it fits."""
        self.encoded[(chain, version)] = enc
        self.nonces[(chain, version)] = nonce
        if view is not None and _nbytes(view) <= self.cache_bytes:
            self._remember((chain, version), view.detach().cpu())
        self._prune(chain, version)

    def _remember(self, key: tuple[str, int], flat: torch.Tensor) -> None:
        self._cache[key] = flat
        self._cache.move_to_end(key)
        while len(self._cache) > self.KEEP and sum(map(_nbytes, self._cache.values())) > self.cache_bytes:
            self._cache.popitem(last=False)

    def holds(self, chain: str, version: int) -> bool:
        return (chain, version) in self.encoded

    def auditable(self, chain: str, version: int) -> bool:
        """Whether (chain, version) can be rebuilt for an audit: a version held, or the base model."""
        return (chain, version) in self.encoded or ((chain, version) == ("", 0) and self._base is not None)

    def _prune(self, chain: str, newest: int) -> None:
        """Keep, of this chain, the versions >= newest - window and the keyframe they start from."""
        oldest = newest - self.window
        keyframes = [v for (c, v), e in self.encoded.items() if c == chain and e.base is None and v <= oldest]
        floor = max(keyframes, default=oldest)
        for key in list(self.encoded):
            if key[0] != chain or key[1] < floor:
                del self.encoded[key], self.nonces[key]
                self._cache.pop(key, None)

    def nonce(self, chain: str, version: int) -> bytes | None:
        return self.nonces.get((chain, version))

    def weights(self, chain: str, version: int) -> dict[str, torch.Tensor] | None:
        """The published weights of (chain, version) exactly as samplers rebuilt them; None if not held."""
        key = (chain, version)
        if key == ("", 0) and self._base is not None:
            return self._base[0].tensors(self._base[1])
        if key not in self.encoded:
            return None
        if key in self._cache:
            self._cache.move_to_end(key)
            return self.encoded[key].layout.tensors(self._cache[key])
        path = [self.encoded[key]]  # back from `version` to a keyframe or a version rebuilt lately
        while path[-1].base is not None and (chain, path[-1].base) not in self._cache:
            enc = self.encoded.get((chain, path[-1].base))
            if enc is None:
                return None
            path.append(enc)
        flat = self._cache.get((chain, path[-1].base)) if path[-1].base is not None else None
        for enc in reversed(path):
            flat = apply_version(flat, enc)
        self._remember(key, flat)
        return self.encoded[key].layout.tensors(flat)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class AuditResult:
    passed: bool
    positions: int
    failed_positions: int
    logprob_gap: float
    """Mean |claimed - recomputed| behaviour log-prob at the claimed version (engine numerics)."""


@dataclass
class AuditItem:
    """One group to audit: its prompt, its completions (tokens, claimed log-probs), their seeds."""

    prompt_ids: list[int]
    completions: list[tuple[list[int], list[float]]]
    seeds: list[bytes]


@torch.no_grad()
def audit_distances(model: torch.nn.Module, items: list[AuditItem], params: SamplingParams,
                    pad_id: int) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Per group: every completion position's miss distance and boundary room (d, m of
    node/checkable.miss_distances, float64 on the CPU, rows in order) under `model` (the weights of
    the version the groups claim), and the mean |claimed - recomputed| behaviour log-prob per
    completion. One forward pass for all groups."""
    rows = [(it.prompt_ids, toks, claimed, seed) for it in items for (toks, claimed), seed in zip(it.completions, it.seeds)]
    device = next(model.parameters()).device
    batch = pack([r[0] for r in rows], [r[1] for r in rows], pad_id).to(device)
    # every completion position in row-major order (the order of completion_mask and of the rows)
    tokens = torch.tensor([t for r in rows for t in r[1]], dtype=torch.long, device=device)
    us = torch.tensor([u for r in rows for u in uniforms(r[3], len(r[1]))], dtype=torch.float64, device=device)
    claimed = torch.tensor([c for r in rows for c in r[2]], dtype=torch.float32, device=device)
    dist, room, mine = torch.zeros_like(us), torch.zeros_like(us), torch.zeros_like(claimed)
    for sl, logits in completion_logits(model, batch):  # whole distributions, chunk by chunk
        dist[sl], room[sl] = miss_distances(logits, tokens[sl], us[sl], params.temperature, params.top_k, params.top_p)
        mine[sl] = logprobs_from_logits(logits, tokens[sl], params.logprob_temperature)
    sizes = [len(r[1]) for r in rows]
    lengths = torch.tensor(sizes, device=device)
    row_of = torch.repeat_interleave(torch.arange(len(rows), device=device), lengths)
    gap = torch.zeros(len(rows), device=device).index_add_(0, row_of, (mine - claimed).abs()) / lengths.clamp(min=1)
    dist, room, gap = dist.cpu(), room.cpu(), gap.tolist()  # one transfer for the whole audit
    out, row, pos = [], 0, 0
    for it in items:
        n = len(it.completions)
        size = sum(sizes[row : row + n])  # host-side: no device sync per group
        out.append((dist[pos : pos + size], room[pos : pos + size], sum(gap[row : row + n]) / max(n, 1)))
        row, pos = row + n, pos + size
    return out


def audit_groups(model: torch.nn.Module, items: list[AuditItem], params: SamplingParams, pad_id: int,
                 tol: float, rel_tol: float = 0.0) -> list[AuditResult]:
    """Check that each completion's tokens are those its seed selects under `model` (the weights
    of the version the groups claim): one forward pass over all the groups' rows. A token passes
    if u_t misses its interval by d <= tol + rel_tol * m (node/checkable.miss_distances: m is the
    room another engine's rounding has at that boundary, so rel_tol bounds that engine's logit
    error range over T)."""
    results = []
    for dist, room, gap in audit_distances(model, items, params, pad_id):
        bad = int((~within_tolerance(dist, room, tol, rel_tol)).sum())
        results.append(AuditResult(bad == 0, len(dist), bad, gap))
    return results


def audit_group(model: torch.nn.Module, prompt_ids: list[int], completions: list[tuple[list[int], list[float]]],
                seeds: list[bytes], params: SamplingParams, pad_id: int, tol: float, rel_tol: float = 0.0) -> AuditResult:
    """`audit_groups` for one group."""
    return audit_groups(model, [AuditItem(prompt_ids, completions, seeds)], params, pad_id, tol, rel_tol)[0]


class RefusalList:
    """Samplers refused for good (a failed audit), with the reason; written through to `path`."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.refused: dict[str, str] = {}
        if path is not None and path.exists():
            try:
                self.refused = {str(k): str(v) for k, v in json.loads(path.read_text()).items()}
            except (OSError, ValueError, AttributeError) as e:  # a damaged file must not stop the learner
                log.error("could not read the refusal list %s (%s); starting with it empty", path, e)

    def __contains__(self, peer: str) -> bool:
        return peer in self.refused

    def add(self, peer: str, why: str) -> None:
        self.refused[peer] = why
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.refused, indent=1))
            os.replace(tmp, self.path)
