"""The learner's own published versions, rebuilt for audits (`VersionArchive`).

    archive = VersionArchive(window=64)          # the learner's own published versions
    archive.put(chain, version, enc, nonce, view)  # on every publish (the view: cached if it fits)
    model_v.load_state_dict(archive.weights(chain, v))

The learner rebuilds the weights a sampler held at version v from its own keyframes and patches
(bit-exact: the same `apply_version` the samplers run), to load them into an audit copy of the
model.
"""

from __future__ import annotations

import collections
from typing import Callable

import torch

from node.sampling.race import BASE_NONCE
from node.weights.codec import EncodedVersion, Layout, apply_version, make_view


class VersionArchive:
    """The learner's published versions of the last `window` versions, as the encoded keyframes and
    patches it sent (plus the base model as chain "" version 0), rebuilt on demand."""

    KEEP = 1
    """Views kept whatever their size: the one rebuilt last, so that a step's audits of consecutive
    versions rebuild each from the one before (a patch), not from the keyframe. One, not more: at
    real size a view is 2 bytes a parameter (a bfloat16 0.6B, 1.2 GB), and the rehearsal's learner
    held 1.6 GB in four of them (docs/BENCHMARKS.md, "The first swarm at real size")."""

    def __init__(self, window: int, cache_bytes: int = 256 << 20) -> None:
        self.window = window
        self.cache_bytes = cache_bytes
        self.encoded: dict[tuple[str, int], EncodedVersion] = {}
        self.nonces: dict[tuple[str, int], bytes] = {("", 0): BASE_NONCE}
        self._base: Callable[[], dict[str, torch.Tensor]] | None = None
        """The base model's weights, held or loaded on demand (`put_base`)."""
        self._cache: collections.OrderedDict[tuple[str, int], torch.Tensor] = collections.OrderedDict()
        """Flat views, newest use last, within `cache_bytes` (or the last `KEEP` used): the
        views the learner published, handed over as it publishes them, and those rebuilt lately. An
        audit of a cached version costs no decode; a rebuild starts from the nearest cached
        ancestor rather than from the keyframe. With a small model every version within the
        staleness samplers show fits (the demo's: 3.2 MB each); a 0.6B float32 view (2.4 GB) does
        not, and is rebuilt from its keyframe and patches (the last `KEEP` rebuilt are kept)."""

    def put_base(self, weights: dict[str, torch.Tensor] | None = None,
                 load: Callable[[], dict[str, torch.Tensor]] | None = None) -> None:
        """The weights every sampler starts from before it loads a version (chain "", version 0),
        until the window passes version 0 (`_prune`). With `load` (which loads them again, from the
        model's folder) nothing is held: an audit of version 0 loads them, a few seconds at real
        size, and only while samplers that hold no version yet are audited. Without it a float32
        copy of `weights` is kept (4 bytes a parameter)."""
        if load is not None:
            self._base = load  # as loaded: a flat copy of them would double the audit's transient
        elif weights is not None:
            layout, flat = Layout.of(weights), make_view(weights, torch.float32).cpu()
            self._base = lambda: layout.tensors(flat)

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
        """Keep, of this chain, the versions >= newest - window and the keyframe they start from;
        and the base model while version 0 is within the window: past it, a group made with the
        base weights is stale (node/learner/intake.py) and never audited, and the copy is 4 bytes a
        parameter (0.8 GB of the rehearsal's learner)."""
        oldest = newest - self.window
        if oldest > 0:
            self._base = None
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
            return self._base()
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
