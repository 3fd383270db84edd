"""The learner's checkpoint metadata: the RNG states, and reading what an older learner wrote.

A checkpoint's `state.json` (node/checkpoint.py) holds `{"format": 2, "version": v, "extra": ...,
"rng": ..., <part>: <part's state_dict>}`. Format 1 (before the learner was split into parts)
kept every counter at the top level; `load_learner_state` reads both, so a volunteer's learner
resumes across the upgrade.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import torch

FORMAT = 2


def rng_state() -> dict[str, Any]:
    """torch's and Python's RNG states, JSON-able: a resumed run draws what the original would."""
    version, internal, gauss = random.getstate()
    return {"torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "python": [version, list(internal), gauss]}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def load_learner_state(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` in the current format (an older one is read as it was written); the RNGs are set."""
    if meta.get("format", 1) == 1:
        meta = _from_format_1(meta)
    elif meta["format"] != FORMAT:
        raise ValueError(f"learner checkpoint format {meta['format']} is newer than this hetero-node reads "
                         f"({FORMAT}): upgrade hetero-node")
    set_rng_state(meta["rng"])
    return meta


def _from_format_1(m: dict[str, Any]) -> dict[str, Any]:
    """Format 1's flat fields, some added over time (hence the defaults), into format 2's parts."""
    return {
        "format": FORMAT, "version": m["version"], "extra": m.get("extra", {}), "rng": m["rng"],
        "books": {"drops": m["drops"], "accepted_by_sampler": m["accepted_by_sampler"],
                  "tally": m.get("tally", {}), "reward_claim_mismatch": m["reward_claim_mismatch"],
                  "version_clamped": m.get("version_clamped", 0)},
        "checks": {"seen": m["seen"], "seen_content": m.get("seen_content", [])},
        "auditor": {"audits": m.get("audits", {}), "stats": m.get("audit_stats", {})},
        "training": {"lr_scale": m.get("lr_scale", 1.0), "gap_drops": m.get("gap_drops", {})},
        "chains": m.get("chains", {}),
    }
