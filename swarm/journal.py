"""A learner's receive journal: every record is appended (and fsynced) before it is acknowledged.

Records are length-prefixed in one append-only file. A reader keeps a cursor (records consumed);
a learner stores that cursor in its checkpoint and, after a restart, replays the journal from it,
so a record acknowledged to a sampler is never lost even if the learner is killed right after.
"""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

_LEN = struct.Struct("<I")


class Journal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._offsets = self._scan()  # byte offset of each complete record
        self._file = open(self.path, "ab")

    def _scan(self) -> list[int]:
        offsets, pos = [], 0
        if not self.path.exists():
            return offsets
        data = self.path.read_bytes()
        while pos + 4 <= len(data):
            (n,) = _LEN.unpack_from(data, pos)
            if pos + 4 + n > len(data):
                break  # a torn write at the tail (killed mid-append): never acknowledged, ignore
            offsets.append(pos)
            pos += 4 + n
        if pos != len(data):
            with open(self.path, "r+b") as f:
                f.truncate(pos)
        return offsets

    def append(self, records: list[bytes]) -> int:
        """Durably append; returns the number of records in the journal afterwards."""
        with self._lock:
            pos = self._file.tell()
            for r in records:
                self._offsets.append(pos)
                self._file.write(_LEN.pack(len(r)) + r)
                pos += 4 + len(r)
            self._file.flush()
            os.fsync(self._file.fileno())
            return len(self._offsets)

    def __len__(self) -> int:
        with self._lock:
            return len(self._offsets)

    def read(self, start: int, max_records: int) -> list[bytes]:
        """Records start .. start + max_records - 1 (fewer if the journal is shorter)."""
        with self._lock:
            offsets = self._offsets[start : start + max_records]
        if not offsets:
            return []
        out = []
        with open(self.path, "rb") as f:
            for off in offsets:
                f.seek(off)
                (n,) = _LEN.unpack(f.read(4))
                out.append(f.read(n))
        return out

    def close(self) -> None:
        with self._lock:
            self._file.close()
