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
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from node.algorithms.base import k3
from node.checkable import BASE_NONCE, keys_tensor, pick_tokens, position_keys, race_margins, within_tolerance
from node.engines.base import SamplingParams
from node.logprobs import completion_logits, logprobs_from_logits, pack
from node.weight_codec import EncodedVersion, Layout, apply_version, make_view

log = logging.getLogger(__name__)


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
        base weights is stale (node/learner/checks.py) and never audited, and the copy is 4 bytes a
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


FLIP_MARGIN = 1e-3
"""A position whose margin exceeds this (logits) counts as a flip: the sampler's token is not the
one the auditor's race selects. Float32 engines differ by ~1e-5 (other kernels, other batch
shapes), far below it; bfloat16 and float16 engines flip near-ties (examples/bench_bf16_audit.py)."""


@dataclass
class AuditResult:
    passed: bool
    """Every position's margin within the tolerance."""
    positions: int
    failed_positions: int
    logprob_gap: float
    """Mean |claimed - recomputed| behaviour log-prob at the claimed version (engine numerics)."""
    flips: int = 0
    """Positions whose margin exceeds FLIP_MARGIN (the per-sampler statistic's events)."""
    max_margin: float = 0.0
    reference_flips: int | None = None
    """Positions at which the auditor's own REFERENCE_DTYPE engine flipped (None: not run)."""
    claim_k3: float = 0.0
    """k3 of log q/p summed over the positions: the claims against the recomputed log-probs, as
    node/learner/behaviour.Mismatch takes it (node/learner/claim_gaps.py)."""


@dataclass
class AuditItem:
    """One group to audit: its prompt, its completions (tokens, claimed log-probs), their seeds."""

    prompt_ids: list[int]
    completions: list[tuple[list[int], list[float]]]
    seeds: list[bytes]


REFERENCE_DTYPE = torch.bfloat16
"""The precision the auditor measures honest flips in, beside its float32 audit: the lowest that
samplers run by default, and the one that flips most (docs/BENCHMARKS.md)."""


@torch.no_grad()
def audit_margins(model: torch.nn.Module, items: list[AuditItem], params: SamplingParams, pad_id: int,
                  reference: bool = False, slack: float = 0.0) -> list[tuple[torch.Tensor, float, int | None, float]]:
    """Per group: every completion position's race margin (node/checkable.race_margins: logits,
    float64 on the CPU, rows in order) under `model` (the weights of the version the groups
    claim), the mean |claimed - recomputed| behaviour log-prob per completion, and, with
    `reference`, the positions at which an honest engine in REFERENCE_DTYPE would flip: a second
    forward pass under autocast on the same prefixes, whose race pick is scored by the float32
    margins (None without `reference`), and the k3 of log q/p (claimed against recomputed) summed
    over the group's positions. One forward pass (two with `reference`) for all groups.
    `slack`: the tolerance top-k / top-p are applied with (node/checkable.race_margins)."""
    rows = [(it.prompt_ids, toks, claimed, seed) for it in items for (toks, claimed), seed in zip(it.completions, it.seeds)]
    device = next(model.parameters()).device
    batch = pack([r[0] for r in rows], [r[1] for r in rows], pad_id).to(device)
    # every completion position in row-major order (the order of completion_mask and of the rows)
    tokens = torch.tensor([t for r in rows for t in r[1]], dtype=torch.long, device=device)
    keys = keys_tensor([k for r in rows for k in position_keys(r[3], len(r[1]))], device)
    claimed = torch.tensor([c for r in rows for c in r[2]], dtype=torch.float32, device=device)
    p = params
    low = None  # the reference engine's picks, scored by the float32 pass below
    if reference:
        low = torch.zeros_like(tokens)
        with torch.autocast(device.type, dtype=REFERENCE_DTYPE):
            for sl, logits in completion_logits(model, batch):
                low[sl] = pick_tokens(logits, keys[sl], p.temperature, p.top_k, p.top_p)
    margins, mine = torch.zeros(len(tokens), dtype=torch.float64, device=device), torch.zeros_like(claimed)
    flipped = torch.zeros(len(tokens), dtype=torch.bool, device=device)
    for sl, logits in completion_logits(model, batch):  # whole distributions, chunk by chunk
        margins[sl] = race_margins(logits, tokens[sl], keys[sl], p.temperature, p.top_k, p.top_p, slack)
        mine[sl] = logprobs_from_logits(logits, tokens[sl], p.logprob_temperature)
        if low is not None:
            flipped[sl] = race_margins(logits, low[sl], keys[sl], p.temperature, p.top_k, p.top_p, slack) > FLIP_MARGIN
    sizes = [len(r[1]) for r in rows]
    lengths = torch.tensor(sizes, device=device)
    row_of = torch.repeat_interleave(torch.arange(len(rows), device=device), lengths)
    gap = torch.zeros(len(rows), device=device).index_add_(0, row_of, (mine - claimed).abs()) / lengths.clamp(min=1)
    claim_k3 = k3((claimed - mine).double())
    margins, gap, flipped, claim_k3 = margins.cpu(), gap.tolist(), flipped.cpu(), claim_k3.cpu()  # one transfer each
    out, row, pos = [], 0, 0
    for it in items:
        n = len(it.completions)
        size = sum(sizes[row : row + n])  # host-side: no device sync per group
        ref = int(flipped[pos : pos + size].sum()) if low is not None else None
        out.append((margins[pos : pos + size], sum(gap[row : row + n]) / max(n, 1), ref,
                    float(claim_k3[pos : pos + size].sum())))
        row, pos = row + n, pos + size
    return out


def judge_margins(margins: torch.Tensor, gap: float, tol: float, reference_flips: int | None = None,
                  claim_k3: float = 0.0) -> AuditResult:
    """A group's result from its positions' margins: it passes if every margin is <= `tol`."""
    bad = int((~within_tolerance(margins, tol)).sum())
    top = float(margins.max()) if len(margins) else 0.0
    return AuditResult(bad == 0, len(margins), bad, gap, int((margins > FLIP_MARGIN).sum()), top, reference_flips,
                       claim_k3)


def audit_groups(model: torch.nn.Module, items: list[AuditItem], params: SamplingParams, pad_id: int,
                 tol: float, reference: bool = False) -> list[AuditResult]:
    """Check that each completion's tokens are those its seeded race selects under `model` (the
    weights of the version the groups claim), within `tol` logits: one forward pass over all the
    groups' rows (and one in REFERENCE_DTYPE with `reference`)."""
    return [judge_margins(margins, gap, tol, ref, k)
            for margins, gap, ref, k in audit_margins(model, items, params, pad_id, reference, slack=tol)]


def audit_group(model: torch.nn.Module, prompt_ids: list[int], completions: list[tuple[list[int], list[float]]],
                seeds: list[bytes], params: SamplingParams, pad_id: int, tol: float) -> AuditResult:
    """`audit_groups` for one group."""
    return audit_groups(model, [AuditItem(prompt_ids, completions, seeds)], params, pad_id, tol)[0]


def flip_llr(flips: int, positions: int, rate: float, ratio: float) -> float:
    """log likelihood ratio of `flips` among `positions` under a flip rate ratio x `rate` (a
    sampler that chooses tokens) against `rate` (the highest honest one)."""
    alt = ratio * rate
    return flips * math.log(alt / rate) + (positions - flips) * math.log((1 - alt) / (1 - rate))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share k/n ((0, 1) for n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def wilson_upper(k: int, n: int) -> float:
    """Upper end of `wilson` (1 for n = 0)."""
    return wilson(k, n)[1]


class FlipRate:
    """The honest flip rate the flip test holds samplers to, measured on this learner's own model.

    Every audit also runs the model in REFERENCE_DTYPE (`audit_margins(reference=True)`) and counts
    the positions where that honest engine's race pick is not the float32 one. The rate is twice
    the upper end of that share's 95% interval, at least FLOOR (kernels other than the learner's)
    and at most `cap` (LearnerConfig.audit_flip_rate: the highest honest rate measured on any
    model). Why: the honest rate depends on the model by 10x (bfloat16: 0.34% on the built-in
    model, 4.3% on a 151k vocabulary), and a constant loose enough for the second lets a sampler
    that chooses tokens flip at 9% unrefused on the first (docs/BENCHMARKS.md)."""

    FACTOR = 2.0
    FLOOR = 0.005
    ENOUGH = 5_000
    """Positions after which the reference runs on one audit in SAMPLE only: the estimate is then
    within a few tenths of a point at the rates seen, and the reference pass (a bfloat16 forward: slow where
    the CPU has no bfloat16 matrix units) stops costing every audit."""
    SAMPLE = 10

    def __init__(self) -> None:
        self.flips = 0
        self.positions = 0
        self._rng = random.Random()

    def wanted(self) -> bool:
        """Whether the next audit should run the reference pass."""
        return self.positions < self.ENOUGH or self._rng.randrange(self.SAMPLE) == 0

    def add(self, flips: int, positions: int) -> None:
        self.flips += flips
        self.positions += positions

    def rate(self, cap: float) -> float:
        if self.positions == 0:
            return cap
        return min(cap, max(self.FLOOR, self.FACTOR * wilson_upper(self.flips, self.positions)))

    def state_dict(self) -> dict:
        return {"flips": self.flips, "positions": self.positions}

    def load_state_dict(self, state: dict) -> None:
        self.flips, self.positions = int(state.get("flips", 0)), int(state.get("positions", 0))


class FlipTest:
    """A sequential probability ratio test of one sampler's flips, over all its audited positions.

    Each audited group adds `flip_llr` of its flips and positions; the sampler is refused once the
    sum reaches log(1 / alarm). For an honest engine, whose flips come at a rate <= `rate`, the
    likelihood ratio is a nonnegative supermartingale, so by Ville's inequality it ever reaches
    1 / alarm with probability <= alarm, over any number of groups (nothing to re-tune for how
    long a sampler stays). A sampler that picks within the tolerance flips more often; it gains
    ~1.4 per flip (ratio 4) and loses ~3 x rate per position, so the sum has no floor: a long
    honest record is credit, spent at most at ~2 x rate flips per position beyond it."""

    RATIO = 4.0
    """The alternative the test is most sensitive to: flips at 4 x the honest rate."""

    def __init__(self, rate: float, alarm: float) -> None:
        self.rate, self.threshold = rate, math.log(1 / alarm)
        """`rate`: the honest rate when `add` is given none."""
        self.last_rate = rate
        self.llr: dict[str, float] = {}
        self.flips: collections.Counter[str] = collections.Counter()
        self.positions: collections.Counter[str] = collections.Counter()

    def add(self, peer: str, flips: int, positions: int, rate: float | None = None) -> bool:
        """Count one audited group's flips against `rate` (fixed before this group is seen, so
        the guarantee holds for any rate at least the honest one); True once `peer` is past the
        threshold."""
        self.flips[peer] += flips
        self.positions[peer] += positions
        self.last_rate = self.rate if rate is None else rate
        self.llr[peer] = self.llr.get(peer, 0.0) + flip_llr(flips, positions, self.last_rate, self.RATIO)
        return self.llr[peer] >= self.threshold

    def why(self, peer: str) -> str:
        return (f"audit statistic: {self.flips[peer]} flips in {self.positions[peer]} audited positions, "
                f"more than an honest engine's {self.last_rate:.2%} (log likelihood ratio {self.llr[peer]:.1f} >= "
                f"{self.threshold:.1f})")

    def state_dict(self) -> dict:
        return {"llr": dict(self.llr), "flips": dict(self.flips), "positions": dict(self.positions)}

    def load_state_dict(self, state: dict) -> None:
        self.llr = {str(k): float(v) for k, v in state.get("llr", {}).items()}
        self.flips = collections.Counter(state.get("flips", {}))
        self.positions = collections.Counter(state.get("positions", {}))


MAX_REFUSED = 100_000
"""Refused keys remembered (~100 bytes a line of `refused.jsonl`, ~200 in memory: ~10 and ~20 MB at
most). Keys are free and a fresh key reaches an audit through the unproven pool's budget, so the list
grows at that budget's audit rate for as long as an attacker pays it; past the bound the oldest
refusal is forgotten: that key is unproven again and must pass its audits (it costs audits, never
trust)."""


class RefusalList:
    """Samplers refused for good (a failed audit), with the reason; appended to `path` a line each
    (JSON lines: ["peer", "why"]), so a refusal costs one line, not a rewrite of every earlier one.
    The file is rewritten (atomically) only when it holds twice the keys remembered. An older
    `refused.json` (one JSON object) beside it is read once and carried over."""

    def __init__(self, path: Path | None = None, max_keys: int = MAX_REFUSED) -> None:
        self.path, self.max_keys = path, max_keys
        self.refused: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lines = 0
        if path is None:
            return
        old = path.with_name("refused.json")
        if old.exists() and not path.exists():
            try:
                for k, v in json.loads(old.read_text()).items():
                    self._remember(str(k), str(v))
            except (OSError, ValueError, AttributeError) as e:  # a damaged file must not stop the learner
                log.error("could not read the refusal list %s (%s); starting with it empty", old, e)
            self._rewrite()
            old.unlink(missing_ok=True)
        if path.exists():
            bad = 0
            try:
                for line in path.read_text().splitlines():
                    try:
                        peer, why = json.loads(line)
                        self._remember(str(peer), str(why))
                    except (ValueError, TypeError):  # a line a kill cut short, or damage: the rest still counts
                        bad += 1
                    self._lines += 1
            except OSError as e:
                log.error("could not read the refusal list %s (%s); starting with it empty", path, e)
            if bad:
                log.error("refusal list %s: %d unreadable lines skipped", path, bad)
                self._rewrite()

    def __contains__(self, peer: str) -> bool:
        return peer in self.refused

    def _remember(self, peer: str, why: str) -> None:
        self.refused.pop(peer, None)
        self.refused[peer] = why
        while len(self.refused) > self.max_keys:
            self.refused.popitem(last=False)

    def add(self, peer: str, why: str) -> None:
        self._remember(peer, why)
        if self.path is None:
            return
        if self._lines + 1 > 2 * self.max_keys:
            self._rewrite()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps([peer, why]) + "\n")
        self._lines += 1

    def _rewrite(self) -> None:
        """The file as the keys remembered now, one line each, replaced atomically."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps([p, w]) + "\n" for p, w in self.refused.items()))
        os.replace(tmp, self.path)
        self._lines = len(self.refused)
