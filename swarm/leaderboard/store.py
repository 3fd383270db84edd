"""The leaderboard's memory: learners' tallies and peers' display names, in SQLite.

Learners' tallies are cumulative, so the store keeps, per learner, only the newest one (by its
sequence number; an older one is a replay and is refused) and sums over learners per peer. It also
keeps a history row whenever a peer's credit changes, so the board and its chart survive restarts
of this service and the expiry of the DHT records. Every refusal is counted by reason: the counts
are the only sign, from outside, that someone is trying to inflate a score.

A learner's progress (its version and latest eval accuracy, carried by its tallies) is kept as a
history too, a row whenever one of them changes: the page's "is the swarm learning" chart.

Nothing here grows with the number of keys, since keys are free: a tally names at most 2,048
peers and sums the rest in `others` (node/learner/credit.py), kept per learner and counted in the
totals; a display name is kept only for a peer some learner's newest tally names, or a learner
(`set_name` refuses others, and a name goes when its peer does), and the collector looks up at
most `MAX_NAME_LOOKUPS` of them a poll, never the whole peers index (service.py).

SQLite with one lock: the collector writes while the HTTP threads read, and the volumes (a row
per learner and peer) are small.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any

import msgspec

from swarm.identity import short_id
from swarm.wire.tally import Tally

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS learners (learner TEXT PRIMARY KEY, seq INTEGER, time REAL, model_id TEXT);
CREATE TABLE IF NOT EXISTS credits (learner TEXT, peer TEXT, groups_ INTEGER, rollouts INTEGER, tokens INTEGER,
                                    first REAL, last REAL, models TEXT, PRIMARY KEY (learner, peer));
CREATE TABLE IF NOT EXISTS history (time REAL, learner TEXT, peer TEXT, rollouts INTEGER, tokens INTEGER);
CREATE TABLE IF NOT EXISTS progress (time REAL, learner TEXT, version INTEGER, eval_acc REAL, eval_version INTEGER);
CREATE TABLE IF NOT EXISTS names (peer TEXT PRIMARY KEY, name TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS counters (reason TEXT PRIMARY KEY, n INTEGER);
CREATE TABLE IF NOT EXISTS others (learner TEXT PRIMARY KEY, count INTEGER, groups_ INTEGER, rollouts INTEGER,
                                   tokens INTEGER);
"""
MAX_NAME_LOOKUPS = 256
"""Display names the collector asks the DHT for per poll (one `own_records` call: swarm/dht/records.py
`MAX_OWNERS`); the wanted ones in turn, so 2,048 credited peers are all looked up every 8 polls."""

_NAMED = "SELECT peer FROM credits UNION SELECT learner FROM learners"
"""Whose display names are kept: the peers a learner's newest tally names, and the learners."""


def clean_name(name: str, limit: int = 64) -> str:
    """Untrusted display text: no control or format characters, at most `limit` characters.
    (HTML escaping happens where it is rendered.)"""
    return "".join(ch for ch in str(name) if unicodedata.category(ch)[0] != "C")[:limit].strip()


class LeaderboardStore:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._lock = threading.Lock()  # the collector writes while HTTP threads read
        self._looked_up = ""  # the last peer whose name `name_lookups` gave (they go in turn)
        with self._lock, self._db:
            self._db.executescript(_SCHEMA)
            self._prune_names()  # a history from before names were bounded

    def _count(self, reason: str) -> None:
        self._db.execute("INSERT INTO counters VALUES (?, 1) ON CONFLICT(reason) DO UPDATE SET n = n + 1", (reason,))

    def ingest(self, tally: Tally | dict[str, Any], trusted: set[str] | None = None) -> str:
        """Take one learner's tally (as the DHT gives it, or its plain form); returns 'new', 'unchanged',
        or why it was refused ('invalid', 'self_credit', 'untrusted', 'replay'), which is also counted."""
        try:
            t = tally if isinstance(tally, Tally) else msgspec.convert(tally, Tally)
        except (msgspec.ValidationError, TypeError, ValueError) as e:
            return self._refuse("invalid", f"malformed tally: {e}")
        if t.learner in t.peers:
            return self._refuse("self_credit", f"learner {short_id(t.learner)} credits itself")
        if trusted is not None and t.learner not in trusted:
            return self._refuse("untrusted", f"tally from {short_id(t.learner)}, not a trusted learner")
        with self._lock, self._db:
            row = self._db.execute("SELECT seq FROM learners WHERE learner = ?", (t.learner,)).fetchone()
            if row is not None and t.seq == row[0]:
                return "unchanged"  # every poll reads every live tally again
            if row is not None and t.seq < row[0]:
                self._count("replay")
                log.warning("refused a replayed tally from %s (seq %d, we have %d)", short_id(t.learner), t.seq, row[0])
                return "replay"
            self._replace(t)
            self._count("accepted")
        return "new"

    def _replace(self, t: Tally) -> None:
        """Put `t` in place of the learner's previous tally (caller holds the lock and the transaction);
        a history row only for the peers whose credit changed, so the history grows with work, not polls."""
        before = dict(self._db.execute("SELECT peer, rollouts FROM credits WHERE learner = ?", (t.learner,)))
        self._db.execute("INSERT OR REPLACE INTO learners VALUES (?, ?, ?, ?)", (t.learner, t.seq, t.time, t.model_id))
        self._db.execute("DELETE FROM credits WHERE learner = ?", (t.learner,))
        self._db.execute("DELETE FROM others WHERE learner = ?", (t.learner,))
        if t.others is not msgspec.UNSET:
            o = t.others
            self._db.execute("INSERT INTO others VALUES (?, ?, ?, ?, ?)", (t.learner, o.count, o.groups, o.rollouts,
                                                                         o.tokens))
        for peer, c in t.peers.items():
            self._db.execute("INSERT INTO credits VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (t.learner, peer, c.groups, c.rollouts, c.tokens, c.first, c.last, json.dumps(c.models)))
            if before.get(peer) != c.rollouts:
                self._db.execute("INSERT INTO history VALUES (?, ?, ?, ?, ?)",
                                 (t.time, t.learner, peer, c.rollouts, c.tokens))
        self._progress(t)
        self._prune_names()

    def _prune_names(self) -> None:
        """Forget the names of peers no tally names any more (caller holds the lock and the transaction)."""
        self._db.execute(f"DELETE FROM names WHERE peer NOT IN ({_NAMED})")

    def _progress(self, t: Tally) -> None:
        """A progress row if the learner's version or eval changed (a tally from before these fields has none)."""
        if t.version is msgspec.UNSET:
            return
        now = (t.version, *((None, None) if t.eval_acc is msgspec.UNSET else (t.eval_acc, t.eval_version)))
        last = self._db.execute("SELECT version, eval_acc, eval_version FROM progress WHERE learner = ? "
                                "ORDER BY rowid DESC LIMIT 1", (t.learner,)).fetchone()
        if last != now:
            self._db.execute("INSERT INTO progress VALUES (?, ?, ?, ?, ?)", (t.time, t.learner, *now))

    def _refuse(self, reason: str, why: str) -> str:
        log.warning("refused a tally: %s", why)
        with self._lock, self._db:
            self._count(reason)
        return reason

    def set_name(self, peer: str, name: str) -> bool:
        """Keep `peer`'s display name if a learner's newest tally names it or it is a learner (else
        nothing: a fresh key's name would cost disk and render time and show nowhere); whether kept."""
        name = clean_name(name)
        if not name:
            return False
        with self._lock, self._db:
            if self._db.execute(f"SELECT 1 FROM ({_NAMED}) WHERE peer = ?", (peer,)).fetchone() is None:
                return False
            row = self._db.execute("SELECT name FROM names WHERE peer = ?", (peer,)).fetchone()
            if row is None or row[0] != name:  # every poll sees every name: write only changes
                self._db.execute("INSERT OR REPLACE INTO names VALUES (?, ?, ?)", (peer, name, time.time()))
        return True

    def named(self) -> set[str]:
        """The peers whose display names are kept: those a learner's newest tally names, and the learners."""
        with self._lock:
            return {p for (p,) in self._db.execute(_NAMED)}

    def name_lookups(self, n: int = MAX_NAME_LOOKUPS) -> list[str]:
        """The next `n` peers whose names to look up, in turn (by id, after the last ones given)."""
        with self._lock:
            rows = self._db.execute(f"SELECT peer FROM ({_NAMED}) WHERE peer > ? ORDER BY peer LIMIT ?",
                                    (self._looked_up, n)).fetchall()
            if len(rows) < n:  # wrap around
                rows += self._db.execute(f"SELECT peer FROM ({_NAMED}) WHERE peer <= ? ORDER BY peer LIMIT ?",
                                         (self._looked_up, n - len(rows))).fetchall()
            out = [p for (p,) in rows]
            if out:
                self._looked_up = out[-1]
            return out

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT reason, n FROM counters"))

    def board(self) -> dict[str, Any]:
        """Per peer, summed over learners, ranked by accepted rollouts; `by_learner` splits a peer's
        rollouts by the learner that credited them, and each learner's progress row carries what it
        credited in all (`rollouts`, from how many `contributors`). `others` sums what the tallies
        credit the peers they do not name with (`count` of them, over learners: a peer two learners
        leave out is counted twice); `total_rollouts`, the shares and each learner's credit include it."""
        with self._lock:
            rows = self._db.execute("SELECT learner, peer, groups_, rollouts, tokens, first, last, models "
                                    "FROM credits ORDER BY learner").fetchall()
            names = dict(self._db.execute("SELECT peer, name FROM names"))
            learners = self._db.execute("SELECT COUNT(*), MAX(time) FROM learners").fetchone()
            unnamed = self._db.execute("SELECT learner, count, groups_, rollouts, tokens FROM others").fetchall()
            progress = self._learners(history=False)  # in the same snapshot as the credits
        peers: dict[str, dict[str, Any]] = {}
        credited: dict[str, list[int]] = {}
        for learner, peer, groups, rollouts, tokens, first, last, models in rows:
            p = peers.setdefault(peer, {"peer_id": peer, "name": names.get(peer, ""), "groups": 0, "rollouts": 0,
                                        "tokens": 0, "first_seen": first, "last_seen": last, "models": [],
                                        "by_learner": {}})
            p["by_learner"][learner] = rollouts
            c = credited.setdefault(learner, [0, 0])
            c[0], c[1] = c[0] + rollouts, c[1] + (rollouts > 0)
            p["groups"] += groups
            p["rollouts"] += rollouts
            p["tokens"] += tokens
            p["first_seen"], p["last_seen"] = min(p["first_seen"], first), max(p["last_seen"], last)
            p["models"] = sorted(set(p["models"]) | set(json.loads(models)))
        others = {"count": 0, "groups": 0, "rollouts": 0, "tokens": 0}
        for learner, count, groups, rollouts, tokens in unnamed:
            c = credited.setdefault(learner, [0, 0])
            c[0], c[1] = c[0] + rollouts, c[1] + count
            for k, v in (("count", count), ("groups", groups), ("rollouts", rollouts), ("tokens", tokens)):
                others[k] += v
        total = sum(p["rollouts"] for p in peers.values()) + others["rollouts"]
        ranked = sorted(peers.values(), key=lambda p: (-p["rollouts"], p["peer_id"]))
        for i, p in enumerate(ranked, 1):
            p["rank"], p["share"] = i, (p["rollouts"] / total if total else 0.0)
        for x in progress:
            x["rollouts"], x["contributors"] = credited.get(x["learner"], (0, 0))
        return {"peers": ranked, "others": others, "total_rollouts": total, "learners": learners[0],
                "updated": learners[1], "learner_progress": progress}

    def history(self) -> dict[str, list[tuple[float, int]]]:
        """peer -> [(time, cumulative accepted rollouts summed over learners)], in time order."""
        with self._lock:
            rows = self._db.execute("SELECT time, learner, peer, rollouts FROM history ORDER BY time, rowid").fetchall()
        latest: dict[tuple[str, str], int] = {}
        total: dict[str, int] = {}
        out: dict[str, list[tuple[float, int]]] = {}
        for t, learner, peer, rollouts in rows:  # one pass: the page asks for this every few seconds
            total[peer] = total.get(peer, 0) + rollouts - latest.get((learner, peer), 0)
            latest[(learner, peer)] = rollouts
            out.setdefault(peer, []).append((t, total[peer]))
        return out

    def learners(self, history: bool = True) -> list[dict[str, Any]]:
        """Per learner (by peer id): its latest version and eval (None: its tallies carry none yet),
        and with `history`, `progress`: [(time, version, eval_acc, eval_version)] in time order, a
        point per change."""
        with self._lock:
            return self._learners(history)

    def _learners(self, history: bool) -> list[dict[str, Any]]:
        """`learners()`, the caller holding the lock."""
        latest_only = "" if history else "WHERE rowid IN (SELECT MAX(rowid) FROM progress GROUP BY learner) "
        rows = self._db.execute("SELECT learner, model_id, time FROM learners ORDER BY learner").fetchall()
        names = dict(self._db.execute("SELECT peer, name FROM names"))
        progress = self._db.execute("SELECT learner, time, version, eval_acc, eval_version FROM progress "
                                    f"{latest_only}ORDER BY rowid").fetchall()
        by_learner: dict[str, list[tuple[float, int, float | None, int | None]]] = {}
        for learner, *point in progress:
            by_learner.setdefault(learner, []).append(tuple(point))
        out = []
        for learner, model_id, updated in rows:
            pts = by_learner.get(learner, [])
            _, version, acc, at = pts[-1] if pts else (None, None, None, None)
            row = {"learner": learner, "name": names.get(learner, ""), "model_id": model_id, "updated": updated,
                   "version": version, "eval_acc": acc, "eval_version": at}
            out.append({**row, "progress": pts} if history else row)
        return out

    def close(self) -> None:
        with self._lock:
            self._db.close()
