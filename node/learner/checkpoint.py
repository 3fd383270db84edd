"""Learner checkpoints on disk: what `Learner.state_dict()` holds, written so a crash never leaves half a one.

A checkpoint is a folder `v{version:08d}/` holding
    model.safetensors   the weights (tied tensors stored once, their aliases in the metadata)
    optimizer.pt        AdamW state
    buffer.msgpack      accepted-but-untrained records, as received (the learner re-accepts them)
    state.json          the learner's metadata, format `FORMAT`: {"format": 2, "version": v,
                        "extra": the runner's, "rng": RNG states, "losses": the
                        losses it trained with, <part>: <part's state_dict>}
written to a temporary folder and renamed, so `latest_checkpoint` never picks a partial one. Only
the newest `keep` are kept, and a temporary folder a kill -9 left mid-write is deleted by the next
save, so the folder holds at most `keep` checkpoints and one being written. This module reads and
writes files, says when (`CheckpointSchedule`), and reads the metadata any earlier format wrote:
format 1 (before the learner was split into parts) kept every counter at the top level, and
`load_learner_state` reads both, so a volunteer's learner resumes across the upgrade. The learner
owns what is in them.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import msgpack
import torch
from safetensors.torch import load_file, save_file

from node.algorithms import get_algorithm
from node.learner.config import DROP, LearnerConfig
from node.weights.blob import retie, untie

log = logging.getLogger(__name__)

FORMAT = 2
"""The metadata's format (state.json's \"format\"): 1 is still read."""


def save_checkpoint(directory: Path, version: int, state: dict[str, Any], keep: int = 3) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final, tmp = directory / f"v{version:08d}", directory / f".tmp-v{version:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tensors, aliases = untie(state["model"])
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"aliases": json.dumps(aliases)})
        torch.save(state["optimizer"], tmp / "optimizer.pt")
        (tmp / "buffer.msgpack").write_bytes(msgpack.packb(state["buffer"], use_bin_type=True))
        (tmp / "state.json").write_text(json.dumps(state["meta"]))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # e.g. a full disk: leave it no fuller
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    prune_checkpoints(directory, keep)
    return final


def prune_checkpoints(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints, and any temporary folder (a save that
    a kill -9 cut short: called after a save, or with none under way); returns what was deleted."""
    old = (_complete(directory)[:-keep] if keep > 0 else []) + sorted(Path(directory).glob(".tmp-v*"))
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def _complete(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).glob("v*") if (p / "state.json").exists())


def latest_checkpoint(directory: Path) -> Path | None:
    found = _complete(directory)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The state a learner saved at `path` (see `Learner.load_state_dict`)."""
    path = Path(path)
    tensors = load_file(str(path / "model.safetensors"))
    aliases = json.loads(_safetensors_metadata(path / "model.safetensors").get("aliases", "{}"))
    return {
        "model": retie(tensors, aliases),
        "optimizer": torch.load(path / "optimizer.pt", weights_only=True),
        "buffer": msgpack.unpackb((path / "buffer.msgpack").read_bytes(), raw=False),
        "meta": json.loads((path / "state.json").read_text()),
    }


def _safetensors_metadata(path: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata() or {}


class CheckpointSchedule:
    """When a learner checkpoints: once `every` versions or `interval_s` seconds (on `clock`) have
    passed since its last checkpoint, whichever comes first (0 turns either off); never twice at
    one version, so an idle learner writes nothing. `version`: the one the run starts at (resumed
    from, so already on disk)."""

    def __init__(self, every: int, interval_s: float, version: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every, self.interval_s, self.clock = every, interval_s, clock
        self.version, self.at = version, clock()

    def due(self, version: int) -> bool:
        if version == self.version:
            return False
        by_versions = self.every > 0 and version - self.version >= self.every
        return by_versions or (self.interval_s > 0 and self.clock() - self.at >= self.interval_s)

    def saved(self, version: int) -> None:
        """A checkpoint of `version` was written (or tried: a failed write waits for the next turn,
        rather than being retried after every step)."""
        self.version, self.at = version, self.clock()

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


def losses_of(cfg: LearnerConfig) -> dict[str, Any]:
    """The losses a learner trains with, by route, each resolved to its whole config (so `{}` and
    the default's values are the same loss, and a default that changes between releases is a
    difference): what a checkpoint records as "losses"."""
    def resolved(name: str, options: dict) -> dict[str, Any]:
        return {"loss": name, "config": {} if name == DROP else asdict(get_algorithm(name).make_config(options))}

    return {"own": resolved(cfg.own_loss, cfg.own_options), "foreign": resolved(cfg.foreign_loss, cfg.foreign_options)}


def say_if_losses_differ(saved: dict[str, Any] | None, cfg: LearnerConfig) -> None:
    """Log a warning when a resumed learner trains with other losses than its checkpoint recorded
    (`saved`, None before the record): the optimizer's state carries over whatever the loss, but a
    default that changed between releases (GRPO -> gepo_lenclip, 2026-12-01) must not switch a run's
    loss unseen."""
    now = losses_of(cfg)
    if saved is None:
        log.warning("checkpoint: it does not record the losses it trained with (written before 2026-12-02); "
                    "resumed with own loss %s and foreign loss %s: if it trained with others (GRPO was the "
                    "default until 2026-12-01), set learner.own_loss and learner.foreign_loss to them",
                    now["own"]["loss"], now["foreign"]["loss"])
    elif saved != json.loads(json.dumps(now)):  # as JSON reads it back: tuples are lists, 0 == 0.0
        log.warning("checkpoint: trained with losses %s, resumed with %s: set learner.own_loss, "
                    "learner.foreign_loss and their options to the saved ones to continue the run as it was",
                    saved, now)
