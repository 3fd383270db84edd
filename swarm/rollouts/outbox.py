"""A sampler's persistent outbox: finished rollouts wait on disk until each learner they are for
acknowledges them.

SQLite (stdlib) in WAL mode: a crash or kill -9 loses nothing already put here, and after a
learner restart or a network fault the same records are simply sent again (learners deduplicate
by record id). `not_before` implements injected rollout delay.

One record can be owed to several learners (docs/DESIGN.md, "Several learners"): it is stored
once, with one `pending` row per learner that has not acknowledged it yet, and deleted when the
last of them has. `OWN` ("") stands for whichever learner the sampler follows when it sends: its
own model's learner may restart under a new key or be replaced, and the rollouts wait for it.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

OWN = ""
"""The learner this sampler follows (its own model's), whoever that is when the record is sent."""


class Outbox:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (id TEXT PRIMARY KEY, data BLOB NOT NULL, "
                         "created REAL NOT NULL, not_before REAL NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS pending (id TEXT NOT NULL, learner TEXT NOT NULL, "
                         "PRIMARY KEY (id, learner))")
        self._db.execute("CREATE INDEX IF NOT EXISTS pending_learner ON pending (learner)")
        self._migrate()
        self._lock = threading.Lock()

    def _migrate(self) -> None:
        """An outbox written before several learners (one table, every record for the followed
        learner) keeps its records: they become the followed learner's."""
        if self._db.execute("SELECT name FROM sqlite_master WHERE name = 'outbox'").fetchone():
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute("INSERT OR IGNORE INTO records SELECT id, data, created, not_before FROM outbox")
                self._db.execute("INSERT OR IGNORE INTO pending SELECT id, ? FROM outbox", (OWN,))
                self._db.execute("DROP TABLE outbox")

    def put(self, record_id: str, data: bytes, delay_s: float = 0.0, to: tuple[str, ...] = (OWN,)) -> None:
        """Keep `data` until every learner in `to` has acknowledged it (or `drop` gives up on one)."""
        now = time.time()
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR IGNORE INTO records VALUES (?, ?, ?, ?)", (record_id, data, now, now + delay_s))
            self._db.executemany("INSERT OR IGNORE INTO pending VALUES (?, ?)", [(record_id, t) for t in to])

    def due(self, max_bytes: int, max_records: int = 512, learner: str = OWN) -> list[tuple[str, bytes]]:
        """Oldest records owed to `learner` whose delay has passed, up to `max_bytes` in total (at least one)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT r.id, r.data FROM pending p JOIN records r ON r.id = p.id WHERE p.learner = ? "
                "AND r.not_before <= ? ORDER BY r.created, r.rowid LIMIT ?", (learner, time.time(), max_records)).fetchall()
        out, size = [], 0
        for rid, data in rows:
            if out and size + len(data) > max_bytes:
                break
            out.append((rid, bytes(data)))
            size += len(data)
        return out

    def remove(self, ids: list[str], learner: str = OWN) -> None:
        """`learner` has settled these (accepted or refused them): no longer owed to it."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM pending WHERE id = ? AND learner = ?", [(i, learner) for i in ids])
            self._collect()

    def trim(self, learner: str, keep: int) -> int:
        """Give up on all but the newest `keep` records owed to `learner`; returns how many were given
        up. For other learners' copies: a slow or absent partner must not grow this file without bound."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            n = self._db.execute(
                "DELETE FROM pending WHERE learner = ? AND id NOT IN (SELECT p.id FROM pending p JOIN records r "
                "ON r.id = p.id WHERE p.learner = ? ORDER BY r.created DESC, r.rowid DESC LIMIT ?)",
                (learner, learner, keep)).rowcount
            self._collect()
        return n

    def _collect(self) -> None:
        self._db.execute("DELETE FROM records WHERE id NOT IN (SELECT id FROM pending)")

    def owed(self, learner: str = OWN) -> int:
        """Records `learner` has not acknowledged yet."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM pending WHERE learner = ?", (learner,)).fetchone()[0]

    def owed_ids(self, learner: str = OWN) -> set[str]:
        """The ids of the records `learner` has not acknowledged yet, delayed ones included."""
        with self._lock:
            return {r[0] for r in self._db.execute("SELECT id FROM pending WHERE learner = ?", (learner,))}

    def learners(self) -> list[str]:
        """Every learner something is owed to (OWN included when it is)."""
        with self._lock:
            return [r[0] for r in self._db.execute("SELECT DISTINCT learner FROM pending ORDER BY learner")]

    def __len__(self) -> int:
        """Records kept (each once, however many learners they are owed to)."""
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
