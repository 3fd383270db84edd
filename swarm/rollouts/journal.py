"""A learner's receive journal: every record is appended (and fsynced) before it is acknowledged.

Records are length-prefixed in one append-only file whose header holds the global index of its
first record. A reader keeps a cursor (a global index: records consumed); a learner stores that
cursor in its checkpoint and, after a restart, replays the journal from it, so a record
acknowledged to a sampler is never lost even if the learner is killed right after. `compact(upto)`
drops the records before `upto` (already in a checkpoint), atomically, so the file stays as large
as the unread tail, not as the whole history. `keep_newest(max_bytes)` bounds a journal kept only
to be read (the learner's quarantine) to its newest records.
"""

from __future__ import annotations

import bisect
import os
import shutil
import struct
import threading
from pathlib import Path

_LEN = struct.Struct("<I")
_HEADER = struct.Struct("<8sQ")
_MAGIC = b"HNJRNL01"


class Journal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        if not self.path.exists() or self.path.stat().st_size < _HEADER.size:
            self._write_file(self.path, 0, [])
        self.first, self._offsets = self._scan()  # global index of the file's first record; byte offsets
        self._file = open(self.path, "ab")

    @staticmethod
    def _write_file(path: Path, first: int, records: list[bytes]) -> None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        with open(tmp, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, first))
            for r in records:
                f.write(_LEN.pack(len(r)) + r)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def _scan(self) -> tuple[int, list[int]]:
        data = self.path.read_bytes()
        magic, first = _HEADER.unpack_from(data, 0)
        if magic != _MAGIC:
            raise ValueError(f"{self.path} is not a hetero-node journal (move it away to start a new one)")
        offsets, pos = [], _HEADER.size
        while pos + 4 <= len(data):
            (n,) = _LEN.unpack_from(data, pos)
            if pos + 4 + n > len(data):
                break  # a torn write at the tail (killed mid-append): never acknowledged, ignore
            offsets.append(pos)
            pos += 4 + n
        if pos != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(pos)
        return first, offsets

    def append(self, records: list[bytes]) -> int:
        """Durably append; returns the global index one past the last record."""
        with self._lock:
            pos = self._file.tell()
            for r in records:
                self._offsets.append(pos)
                self._file.write(_LEN.pack(len(r)) + r)
                pos += 4 + len(r)
            self._file.flush()
            os.fsync(self._file.fileno())
            return self.first + len(self._offsets)

    def __len__(self) -> int:
        """The global index one past the last record (records ever appended, compacted ones too)."""
        with self._lock:
            return self.first + len(self._offsets)

    def read(self, start: int, max_records: int) -> list[bytes]:
        """Records start .. start + max_records - 1 (global indices; fewer if the journal is shorter).
        Records before `first` were compacted away: asking for them is a bug (ValueError)."""
        with self._lock:
            if start < self.first:
                raise ValueError(f"journal records before {self.first} were compacted (asked from {start})")
            offsets = self._offsets[start - self.first : start - self.first + max_records]
        if not offsets:
            return []
        out = []
        with open(self.path, "rb") as f:
            for off in offsets:
                f.seek(off)
                (n,) = _LEN.unpack(f.read(4))
                out.append(f.read(n))
        return out

    def compact(self, upto: int) -> int:
        """Drop the records before global index `upto`; returns how many were dropped. The file is
        rewritten with only the rest (its size on disk shrinks), then renamed over the old one."""
        with self._lock:
            return self._drop_first(min(max(upto - self.first, 0), len(self._offsets)))

    def keep_newest(self, max_bytes: int) -> int:
        """Drop the oldest records until those left take at most `max_bytes` (length prefixes
        included); returns how many were dropped. For a log kept only to be read, not replayed."""
        with self._lock:
            end = self._end()
            drop = bisect.bisect_left(self._offsets, end - max_bytes)
            return self._drop_first(drop)

    @property
    def nbytes(self) -> int:
        """The file's size: its header and the records not compacted away."""
        with self._lock:
            return self._end()

    def _end(self) -> int:
        self._file.flush()
        return self._file.tell()

    def _drop_first(self, drop: int) -> int:
        """Rewrite the file without its first `drop` records; the caller holds the lock."""
        if drop == 0:
            return 0
        keep_from = self._offsets[drop] if drop < len(self._offsets) else self._end()
        self._file.close()
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(self.path, "rb") as src, open(tmp, "wb") as f:
            f.write(_HEADER.pack(_MAGIC, self.first + drop))
            src.seek(keep_from)
            shutil.copyfileobj(src, f)  # streamed: the tail may be large, memory stays small
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        shift = keep_from - _HEADER.size
        self.first += drop
        self._offsets = [o - shift for o in self._offsets[drop:]]
        self._file = open(self.path, "ab")
        return drop

    def close(self) -> None:
        with self._lock:
            self._file.close()
