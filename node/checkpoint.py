"""Learner checkpoints that resume exactly: same version sequence, same metrics, no data lost.

A checkpoint is a folder `v{version:08d}/` holding
    model.safetensors   the weights
    optimizer.pt        AdamW state
    buffer.msgpack      accepted-but-untrained records, as received (re-accepted on load)
    state.json          version, counters, seen record ids, RNG states
written to a temporary folder and renamed, so a crash mid-save never leaves a half checkpoint
that `latest_checkpoint` would pick.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import torch
from safetensors.torch import load_model, save_model

from swarm.records import decode_rollout_group
from swarm.tally import Tally

if TYPE_CHECKING:
    from .learner import Learner


def save_learner_checkpoint(learner: "Learner", directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"v{learner.version:08d}"
    tmp = directory / f".tmp-v{learner.version:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model(learner.model, str(tmp / "model.safetensors"))  # handles tied embeddings
    torch.save(learner.optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "buffer.msgpack").write_bytes(msgpack.packb([b.raw for b in learner.buffer], use_bin_type=True))
    state = {
        "version": learner.version,
        "drops": dict(learner.drops),
        "accepted_by_sampler": dict(learner.accepted_by_sampler),
        "tally": {"peers": learner.tally.peers, "seq": learner.tally.seq},
        "reward_claim_mismatch": learner.reward_claim_mismatch,
        "version_clamped": learner.version_clamped,
        "seen": list(learner.seen),
        "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python_rng": _py_rng_to_json(random.getstate()),
        "extra": learner.checkpoint_extra(),
    }
    (tmp / "state.json").write_text(json.dumps(state))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    return final


def _py_rng_to_json(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _py_rng_from_json(state: list) -> tuple:
    return (state[0], tuple(state[1]), state[2])


def latest_checkpoint(directory: Path) -> Path | None:
    found = sorted(p for p in Path(directory).glob("v*") if (p / "state.json").exists())
    return found[-1] if found else None


def load_learner_checkpoint(learner: "Learner", path: Path) -> None:
    state = json.loads((path / "state.json").read_text())
    load_model(learner.model, str(path / "model.safetensors"))
    learner.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    learner.version = state["version"]
    learner.drops = collections.Counter(state["drops"])
    learner.accepted_by_sampler = collections.Counter(state["accepted_by_sampler"])
    learner.tally = Tally(**state.get("tally", {}))
    learner.reward_claim_mismatch = state["reward_claim_mismatch"]
    learner.version_clamped = state.get("version_clamped", 0)
    learner.seen = collections.OrderedDict.fromkeys(state["seen"])
    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch_rng"])), dtype=torch.uint8))
    random.setstate(_py_rng_from_json(state["python_rng"]))
    learner.restored_extra = state.get("extra", {})
    learner.buffer.clear()
    for raw in msgpack.unpackb((path / "buffer.msgpack").read_bytes(), raw=False):
        # these records were validated and accepted before the save: re-accept without recounting
        learner._accept(decode_rollout_group(raw), raw, count=False)
