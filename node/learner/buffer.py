"""The learner's buffer: accepted groups not yet trained on, and how a step's groups are chosen.

Invariants: an accepted group stays here (and in checkpoints, as the record received) until it is
trained on, dropped as stale, or its sampler is refused; no sampler takes more than its share of a
step while others have groups waiting (round-robin), and unchecked work only within its shares.
"""

from __future__ import annotations

import collections
import math
from typing import Callable, Iterator

from node.learner.config import LearnerConfig
from node.learner.groups import BufferedGroup, GroupKind


class GroupBuffer:
    def __init__(self, cfg: LearnerConfig) -> None:
        self.cfg = cfg
        self._groups: collections.deque[BufferedGroup] = collections.deque()
        self._by_sampler: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator[BufferedGroup]:
        return iter(self._groups)

    def __getitem__(self, i: int) -> BufferedGroup:
        return self._groups[i]

    @property
    def full(self) -> bool:
        return len(self._groups) >= self.cfg.max_buffer_groups

    def untrained(self, sampler: str) -> int:
        """Groups of `sampler` here: accepted and not yet trained on."""
        return self._by_sampler[sampler]

    def append(self, b: BufferedGroup) -> None:
        self._groups.append(b)
        self._by_sampler[b.sampler] += 1

    def put_back(self, groups: list[BufferedGroup]) -> None:
        """Return groups a step took but did not train on (waiting for their key's first audits) to
        the front, in their order: they are older than anything that arrived since."""
        for b in reversed(groups):
            self._groups.appendleft(b)
            self._by_sampler[b.sampler] += 1

    def drop_aged(self, version: int) -> int:
        """Drop own-model groups older than the learner will take at `version` (`max_staleness`, or
        `wait_staleness` when set); returns how many."""
        limit = min(self.cfg.max_staleness, self.cfg.wait_staleness or self.cfg.max_staleness)
        return self._drop(lambda b: b.own and version - b.group.version > limit)

    def drop_sampler(self, sampler: str) -> int:
        """Drop every group of `sampler` (refused); returns how many."""
        return self._drop(lambda b: b.sampler == sampler)

    def _drop(self, gone: Callable[[BufferedGroup], bool]) -> int:
        keep: collections.deque[BufferedGroup] = collections.deque()
        dropped = 0
        for b in self._groups:
            if gone(b):
                self._by_sampler[b.sampler] -= 1
                dropped += 1
            else:
                keep.append(b)
        self._groups = keep
        return dropped

    def pick(self, kind_of: Callable[[BufferedGroup], GroupKind], new: int | None = None) -> list[int]:
        """Indices of the next step's groups (`pick_groups` with the foreign and unaudited shares,
        and at most `new` of new keys' groups: what the audit budget admits, default a step's
        worth; foreign groups within their share of the step taken, `within_share`), oldest first,
        or newest version first with `take_newest`."""
        n = self.cfg.groups_per_step
        buf = list(self._groups)  # a deque: indexing it is O(n)
        order = list(range(len(buf)))
        if self.cfg.take_newest:  # newest version first; arrival order among equals
            order.sort(key=lambda i: -buf[i].group.version)
        picked = pick_groups([(buf[i].sampler, kind_of(buf[i])) for i in order], n,
                             {GroupKind.FOREIGN: math.floor(self.cfg.foreign.step_share * n + 1e-9),
                              GroupKind.UNAUDITED: self.cfg.unaudited_per_step,
                              GroupKind.NEW: n if new is None else new},
                             # a new key's groups past its first audits would only bounce back (Auditor.audit)
                             {GroupKind.FOREIGN: self.cfg.foreign.per_sampler, GroupKind.NEW: max(1, self.cfg.audit.first)})
        picked = [picked[j] for j in within_share([kind_of(buf[order[i]]) for i in picked], self.cfg.foreign.step_share)]
        return [order[j] for j in picked]

    def ready(self, kind_of: Callable[[BufferedGroup], GroupKind], is_proven: Callable[[str], bool],
              new: int | None = None) -> bool:
        """Whether a full step can be taken within the foreign and unaudited shares; or a short one,
        of what the shares allow, when `groups_per_step` groups wait and waiting cannot fill a step:
        none of them is checked work, or unproven keys' groups fill their shared budget (the swarm's
        receiver takes no more from any new key until some are trained on: waiting would stall).
        Foreign groups alone never make a step (`within_share`): see `drop_unpaired`."""
        n = self.cfg.groups_per_step
        if len(self._groups) < n:
            return False
        picked = len(self.pick(kind_of, new))
        if picked >= n or picked == 0:
            return picked >= n
        if all(kind_of(b) not in (GroupKind.CHECKED, GroupKind.NEW) for b in self._groups):
            return True
        if new == 0 and any(kind_of(b) is GroupKind.NEW for b in self._groups):
            return True  # new keys wait for the audit budget, which only training refills: train what can be
        return self._pool_full(is_proven)

    def _pool_full(self, is_proven: Callable[[str], bool]) -> bool:
        unproven = sum(not is_proven(b.sampler) for b in self._groups)
        return unproven >= max(self.cfg.intake.unproven_quota, self.cfg.groups_per_step)

    def drop_unpaired(self, kind_of: Callable[[BufferedGroup], GroupKind], is_proven: Callable[[str], bool],
                      new: int | None = None) -> int:
        """When no step can be picked, foreign groups wait, and unproven keys' groups fill their
        pool: drop the oldest foreign groups, a step's worth; returns how many. A partner's sampler
        is never proven here, so its groups draw on the pool with every new key of our model; with
        more such keys than the pool's cap (keys are free) a new key's fair share is 0, and foreign
        groups that no step takes would hold the pool for good. Foreign-only steps used to drain
        them; dropping them drains it without training on them alone. While steps are taken, the
        foreign groups past their share wait, and the pool's bounds hold their senders back (busy),
        as before: dropping acknowledged work there would lose it where backpressure does not."""
        # cheapest first: this runs before every step check, and `pick` (again in `ready`) is the cost
        if not self._pool_full(is_proven) or not any(kind_of(b) is GroupKind.FOREIGN for b in self._groups) \
                or self.pick(kind_of, new):
            return 0
        oldest = {id(b) for b in [b for b in self._groups if kind_of(b) is GroupKind.FOREIGN][:self.cfg.groups_per_step]}
        return self._drop(lambda b: id(b) in oldest)

    def only_foreign(self, kind_of: Callable[[BufferedGroup], GroupKind]) -> bool:
        """Whether a step's worth of groups waits, all of them foreign, and the share keeps them
        from stepping alone (foreign.step_share < 1)."""
        return (self.cfg.foreign.step_share < 1 and len(self._groups) >= self.cfg.groups_per_step
                and all(kind_of(b) is GroupKind.FOREIGN for b in self._groups))

    def take(self, kind_of: Callable[[BufferedGroup], GroupKind], new: int | None = None) -> list[BufferedGroup]:
        """Remove and return the next step's groups (`pick`)."""
        buffered, picked = list(self._groups), self.pick(kind_of, new)
        chosen = set(picked)
        self._groups = collections.deque(b for i, b in enumerate(buffered) if i not in chosen)
        taken = [buffered[i] for i in picked]  # in pick order: the step's batch order
        for b in taken:
            self._by_sampler[b.sampler] -= 1
        return taken

    def state_dict(self) -> list[bytes]:
        """The records as received: a resumed learner re-accepts them."""
        return [b.raw for b in self._groups]

    def clear(self) -> None:
        self._groups.clear()
        self._by_sampler.clear()


def within_share(kinds: list[str], share: float) -> list[int]:
    """Positions of a step's picked `kinds` to keep: every group that is not foreign, and the first
    foreign ones while they stay within `share` of the step actually taken. A full step is within it
    already (`pick_groups` caps foreign groups at floor(share x n)); a short one holding k other
    groups keeps f <= share x (k + f), i.e. f <= share x k / (1 - share): none when k = 0, so a
    learner never trains on another model's rollouts alone unless share is 1 (Learner.step applies it
    again to what its audits and recomputation leave). (Seen: learner a of
    tests/integration/swarm/test_swarm_learners.py, its own sampler joining 40 s late, took 160
    steps of its partners' groups alone; its eval every 10 steps went 40, 48, 44, 40, 37, 36, 31,
    36, 31, 36, 41, 48, 48, 43, 45, 48%: no learning, swings of 17 points. In CI, where its steps'
    make-up was not kept, it ended its 40 steps at its start, 40%, after 28.5% at step 20.)"""
    others = sum(k != GroupKind.FOREIGN for k in kinds)
    room = len(kinds) if share >= 1 else math.floor(share * others / (1 - share) + 1e-9)
    keep: list[int] = []
    for i, k in enumerate(kinds):
        if k != GroupKind.FOREIGN:
            keep.append(i)
        elif room > 0:
            keep.append(i)
            room -= 1
    return keep


def pick_groups(entries: list[tuple[str, str]], n: int, total_caps: dict[str, int],
                sampler_caps: dict[str, int]) -> list[int]:
    """Up to `n` indices of `entries` ((sampler, kind), oldest first), round-robin over samplers,
    oldest first within each, taking at most `total_caps[kind]` of a kind in all and at most
    `sampler_caps[kind]` of it from one sampler (kinds not named are uncapped)."""
    queues: dict[str, collections.deque[int]] = {}
    for i, (sampler, _) in enumerate(entries):
        queues.setdefault(sampler, collections.deque()).append(i)
    used: collections.Counter[str] = collections.Counter()
    used_by: collections.Counter[tuple[str, str]] = collections.Counter()
    taken: list[int] = []
    while len(taken) < n and queues:
        for sampler in list(queues):
            q = queues[sampler]
            # usage only grows within a pick, so a group over a cap now stays over it: skip it for good
            while q and (used[entries[q[0]][1]] >= total_caps.get(entries[q[0]][1], n)
                         or used_by[sampler, entries[q[0]][1]] >= sampler_caps.get(entries[q[0]][1], n)):
                q.popleft()
            if not q:
                del queues[sampler]
            elif len(taken) < n:
                i = q.popleft()
                taken.append(i)
                used[entries[i][1]] += 1
                used_by[sampler, entries[i][1]] += 1
    return taken
