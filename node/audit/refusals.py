"""The samplers refused for good (a failed audit), on disk: a refusal survives restarts.

A sampler whose audited group fails is refused for good: its buffered groups are dropped, its
credit is revoked, and the refusal is written to disk at once, so a restart keeps it.
"""

from __future__ import annotations

import collections
import json
import logging
import os
from pathlib import Path



log = logging.getLogger(__name__)


MAX_REFUSED = 100_000
"""Refused keys remembered (~100 bytes a line of `refused.jsonl`, ~200 in memory: ~10 and ~20 MB at
most). Keys are free and a fresh key reaches an audit through the unproven pool's budget, so the list
grows at that budget's audit rate for as long as an attacker pays it; past the bound the oldest
refusal is forgotten: that key is unproven again and must pass its audits (it costs audits, never
trust)."""


class RefusalList:
    """Samplers refused for good (a failed audit), with the reason; appended to `path` a line each
    (JSON lines: ["peer", "why"]), so a refusal costs one line, not a rewrite of every earlier one.
    The file is rewritten (atomically) only when it holds twice the keys remembered. An older
    `refused.json` (one JSON object) beside it is read once and carried over."""

    def __init__(self, path: Path | None = None, max_keys: int = MAX_REFUSED) -> None:
        self.path, self.max_keys = path, max_keys
        self.refused: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._lines = 0
        if path is None:
            return
        old = path.with_name("refused.json")
        if old.exists() and not path.exists():
            try:
                for k, v in json.loads(old.read_text()).items():
                    self._remember(str(k), str(v))
            except (OSError, ValueError, AttributeError) as e:  # a damaged file must not stop the learner
                log.error("could not read the refusal list %s (%s); starting with it empty", old, e)
            self._rewrite()
            old.unlink(missing_ok=True)
        if path.exists():
            bad = 0
            try:
                for line in path.read_text().splitlines():
                    try:
                        peer, why = json.loads(line)
                        self._remember(str(peer), str(why))
                    except (ValueError, TypeError):  # a line a kill cut short, or damage: the rest still counts
                        bad += 1
                    self._lines += 1
            except OSError as e:
                log.error("could not read the refusal list %s (%s); starting with it empty", path, e)
            if bad:
                log.error("refusal list %s: %d unreadable lines skipped", path, bad)
                self._rewrite()

    def __contains__(self, peer: str) -> bool:
        return peer in self.refused

    def _remember(self, peer: str, why: str) -> None:
        self.refused.pop(peer, None)
        self.refused[peer] = why
        while len(self.refused) > self.max_keys:
            self.refused.popitem(last=False)

    def add(self, peer: str, why: str) -> None:
        self._remember(peer, why)
        if self.path is None:
            return
        if self._lines + 1 > 2 * self.max_keys:
            self._rewrite()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps([peer, why]) + "\n")
        self._lines += 1

    def _rewrite(self) -> None:
        """The file as the keys remembered now, one line each, replaced atomically."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps([p, w]) + "\n" for p, w in self.refused.items()))
        os.replace(tmp, self.path)
        self._lines = len(self.refused)
