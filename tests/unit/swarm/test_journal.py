"""swarm/rollouts/journal.py: compaction shrinks the file on disk (not only the index), a reopened journal
reads the same records, and `keep_newest` bounds a journal kept only to be read."""

from __future__ import annotations

from swarm.rollouts.journal import Journal


def _records(n: int, size: int = 1000) -> list[bytes]:
    return [bytes([i % 256]) * size for i in range(n)]


def test_compaction_truncates_the_file_on_disk_and_a_reopened_journal_reads_the_rest(tmp_path):
    path = tmp_path / "journal.bin"
    journal = Journal(path)
    records = _records(100)
    assert journal.append(records) == 100
    full = path.stat().st_size
    assert full == journal.nbytes >= 100 * 1004  # each record: 4 bytes of length, then its bytes
    assert journal.compact(90) == 90
    small = path.stat().st_size
    assert small == journal.nbytes and small < 11 * 1004 + 64, (full, small)
    assert journal.read(90, 100) == records[90:]
    journal.append([b"after"])  # appends land after the kept tail, at their global index
    assert journal.read(100, 1) == [b"after"] and len(journal) == 101
    journal.close()
    again = Journal(path)
    assert again.first == 90 and len(again) == 101 and again.read(90, 100) == records[90:] + [b"after"]
    assert again.compact(50) == 0 and again.compact(101) == 11 and again.read(101, 5) == []
    assert path.stat().st_size == again.nbytes < 64  # the header alone
    assert not path.with_suffix(".bin.tmp").exists()


def test_keep_newest_bounds_the_file_to_its_newest_records(tmp_path):
    journal = Journal(tmp_path / "quarantine.bin")
    records = _records(50)
    journal.append(records)
    assert journal.keep_newest(10 * 1004) == 40
    assert journal.first == 40 and journal.read(40, 100) == records[40:]
    assert (tmp_path / "quarantine.bin").stat().st_size <= 10 * 1004 + 64
    assert journal.keep_newest(10 * 1004) == 0  # within the bound already
    assert journal.keep_newest(0) == 10 and journal.read(50, 1) == []
