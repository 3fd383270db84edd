"""A sampler's persistent outbox: finished rollouts wait on disk until a learner acknowledges them.

SQLite (stdlib) in WAL mode: a crash or kill -9 loses nothing already put here, and after a
learner restart or a network fault the same records are simply sent again (learners deduplicate
by record id). `not_before` implements injected rollout delay.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path


class Outbox:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS outbox (id TEXT PRIMARY KEY, data BLOB NOT NULL, "
                         "created REAL NOT NULL, not_before REAL NOT NULL)")
        self._lock = threading.Lock()

    def put(self, record_id: str, data: bytes, delay_s: float = 0.0) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO outbox VALUES (?, ?, ?, ?)", (record_id, data, now, now + delay_s))

    def due(self, max_bytes: int, max_records: int = 512) -> list[tuple[str, bytes]]:
        """Oldest records whose delay has passed, up to `max_bytes` in total (at least one)."""
        with self._lock:
            rows = self._db.execute("SELECT id, data FROM outbox WHERE not_before <= ? ORDER BY created LIMIT ?",
                                    (time.time(), max_records)).fetchall()
        out, size = [], 0
        for rid, data in rows:
            if out and size + len(data) > max_bytes:
                break
            out.append((rid, bytes(data)))
            size += len(data)
        return out

    def remove(self, ids: list[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
