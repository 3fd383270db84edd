"""The learner's checkpoints (node/learner/checkpoint.py and the runner's `Checkpoints`, cli/roles/learner.py):
when they are written (by versions or by time, whichever first), that the disk holds at most
`keep_checkpoints` of them (a half-written one a kill -9 left included), that the journal shrinks
on disk after each, and that the quarantine stays within its bound. Unit: the in-memory tiny
learner, a real journal, a virtual clock; the same with real processes and a real kill -9 is
tests/integration/node/test_checkpoint_kill9.py."""

from __future__ import annotations

import json

from node.learner.config import AuditConfig, CheckpointConfig

import pytest

from cli.roles.learner import Checkpoints, JournalCursor, Quarantine
from helpers.inmemory import tiny_swarm
from node.learner.checkpoint import CheckpointSchedule, latest_checkpoint, prune_checkpoints
from node.learner import LearnerConfig
from swarm.rollouts.journal import Journal
from helpers.clock import Clock


def test_the_schedule_fires_on_versions_or_time_whichever_first_and_never_twice_at_a_version():
    clock = Clock()
    s = CheckpointSchedule(every=10, interval_s=60.0, version=5, clock=clock)
    assert not s.due(14) and s.due(15)  # ten versions since the one it resumed from
    s.saved(15)
    clock.t = 59.9
    assert not s.due(16)
    clock.t = 60.0
    assert s.due(16) and not s.due(15)  # a minute on, at a new version; never again at the saved one
    s.saved(16)
    clock.t = 119.9
    assert not s.due(25) and s.due(26)  # versions first this time
    clock.t = 1000.0
    assert not s.due(16)  # idle for 15 minutes at one version: nothing new to write
    assert not CheckpointSchedule(0, 60.0, 0, clock).due(10**6)  # versions off; its minute starts now
    assert not CheckpointSchedule(10, 0.0, 0, clock).due(9)  # time off...
    assert CheckpointSchedule(10, 0.0, 0, clock).due(10)  # ...versions still on
    off = CheckpointSchedule(0, 0.0, 0, clock)
    clock.t = 10**9
    assert not off.due(10**6)


def test_the_config_says_how_to_turn_checkpoints_off():
    assert LearnerConfig().checkpoint.every > 0 and LearnerConfig().checkpoint.interval_s > 0  # on by default
    with pytest.raises(ValueError, match=r"learner.checkpoint: need interval_s >= 0 \(0: off\)"):
        LearnerConfig(checkpoint=CheckpointConfig(interval_s=-1.0))
    with pytest.raises(ValueError, match=r"learner.checkpoint: need every >= 0 \(0: off\)"):
        LearnerConfig(checkpoint=CheckpointConfig(every=-1))


def test_pruning_keeps_the_newest_and_deletes_what_a_kill_during_a_write_left(tmp_path):
    for v in (1, 2, 3, 4):
        (tmp_path / f"v{v:08d}").mkdir()
        (tmp_path / f"v{v:08d}" / "state.json").write_text("{}")
    cut = tmp_path / ".tmp-v00000005"  # killed mid-write: weights half there, no state.json
    cut.mkdir()
    (cut / "model.safetensors").write_bytes(b"\0" * 4096)
    assert latest_checkpoint(tmp_path).name == "v00000004"  # never the partial one
    gone = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in gone) == [".tmp-v00000005", "v00000001", "v00000002"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v00000003", "v00000004"]


class Reader:
    """The receiver's side the runner sees: a cursor into the journal, moved as records are taken."""

    def __init__(self, journal: Journal) -> None:
        self.journal, self.cursor = journal, journal.first

    def take(self) -> list[bytes]:
        out = self.journal.read(self.cursor, 1000)
        self.cursor += len(out)
        return out


def test_the_learner_checkpoints_by_versions_and_by_time_keeps_a_bounded_disk_and_compacts(tmp_path):
    folder = tmp_path / "work" / "checkpoints"
    journal = Journal(tmp_path / "work" / "journal.bin")
    reader = Reader(journal)
    cursor = JournalCursor(journal, reader)
    s = tiny_swarm(folder, groups_per_step=2, checkpoint=CheckpointConfig(every=3, interval_s=1.0, keep=2), audit=AuditConfig(first=0, rate=0.0, established_after=0, rate_established=0.0),
                   checkpoint_extra=cursor.checkpoint_extra)  # as the runner builds it (make_learner)
    learner, sampler, clock = s.learner, s.samplers[0], Clock()
    ckpts = Checkpoints(learner, folder, cursor, clock=clock)

    def step() -> str | None:
        journal.append([g.encode() for g in sampler.produce(2)])  # acknowledged: journaled first
        learner.ingest_many(reader.take())
        assert learner.step() is not None
        path = ckpts.after_step()
        return path.name if path else None

    def on_disk() -> list[str]:
        return sorted(p.name for p in folder.iterdir() if p.name != "refused.jsonl")

    # by versions, the clock standing still: v3 and v6
    assert [step() for _ in range(7)] == [None, None, "v00000003", None, None, "v00000006", None]
    assert on_disk() == ["v00000003", "v00000006"]  # keep_checkpoints = 2
    # the journal holds only what v6 does not (v7's groups), on disk
    assert journal.first == 12 and len(journal) == 14
    grown = journal.path.stat().st_size
    assert grown == journal.nbytes > 16
    # by time: a second later the next version is written although only 2 versions passed
    journal.append([g.encode() for g in sampler.produce(2)] * 3)  # more arrives meanwhile: unread tail
    clock.t = 1.0
    (folder / ".tmp-v00000009").mkdir()  # a save a kill -9 cut short, left over
    (folder / ".tmp-v00000009" / "optimizer.pt").write_bytes(b"\0" * 10_000)
    before = journal.path.stat().st_size
    assert step() == "v00000008"
    after = journal.path.stat().st_size
    assert after < before, (before, after)  # truncated on disk, not only in the index
    assert journal.first == reader.cursor == len(journal) and after == 16  # all of it read: the header alone
    assert on_disk() == ["v00000006", "v00000008"]  # the partial folder is gone too
    # idle: time passes, no new version, nothing written
    clock.t = 100.0
    assert ckpts.after_step() is None and on_disk() == ["v00000006", "v00000008"]
    assert latest_checkpoint(folder).name == "v00000008"
    again = tiny_swarm(tmp_path / "again", groups_per_step=2).learner
    again.load_checkpoint(latest_checkpoint(folder))
    assert again.version == 8 and again.restored_extra == {"journal_cursor": journal.first}


def test_the_quarantine_keeps_its_newest_records_within_its_bound(tmp_path):
    q = Quarantine(tmp_path / "quarantine.bin", max_bytes=100_000)
    for i in range(300):  # ~1 kB each: 300 kB in all
        q(bytes([i % 256]) * 1000, f"step: OutOfMemoryError {i}")
        assert (tmp_path / "quarantine.bin").stat().st_size <= 100_000
    kept = q.journal.read(q.journal.first, 1000)
    assert 50 <= len(kept) <= 100 and q.journal.first + len(kept) == 300  # the newest, in order


def test_a_resume_under_other_losses_than_the_checkpoint_trained_with_says_so(tmp_path, caplog):
    # A default that changes between releases (GRPO -> gepo_lenclip, 2026-12-01) would otherwise
    # switch a resumed run's loss unseen.
    folder = tmp_path / "ckpt"
    s = tiny_swarm(folder, groups_per_step=2, own_loss="grpo",
                   audit=AuditConfig(first=0, rate=0.0, established_after=0, rate_established=0.0))
    s.learner.ingest_many([g.encode() for g in s.samplers[0].produce(2)])
    assert s.learner.step() is not None
    path = s.learner.save_checkpoint(folder)
    said = lambda: [r.getMessage() for r in caplog.records if "resumed with" in r.getMessage()]  # noqa: E731
    with caplog.at_level("WARNING", logger="node.learner.checkpoint"):
        # the same loss, its default option spelt out (and an int for a float): nothing to say
        same = tiny_swarm(tmp_path / "same", groups_per_step=2, own_loss="grpo", own_options={"eps_low": 0.2, "beta": 0})
        same.learner.load_checkpoint(path)
        assert not said()
        tiny_swarm(tmp_path / "other", groups_per_step=2, own_loss="gepo_lenclip").learner.load_checkpoint(path)
        assert len(said()) == 1 and "'grpo'" in said()[0] and "'gepo_lenclip'" in said()[0]
        # a checkpoint from before the record: says it cannot tell, and what it resumes with
        meta = json.loads((path / "state.json").read_text())
        del meta["losses"]
        (path / "state.json").write_text(json.dumps(meta))
        caplog.clear()
        tiny_swarm(tmp_path / "older", groups_per_step=2).learner.load_checkpoint(path)
        assert len(said()) == 1 and "does not record the losses" in said()[0] and "gepo_lenclip" in said()[0]
