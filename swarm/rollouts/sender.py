"""The sampler's side of hetero.rollouts.v2: records wait in a persistent outbox and a background
thread per learner sends what is due to it, with exponential backoff while it is unreachable; a
record leaves the outbox only once every learner it is for settled it (ok or rejected), or, for a
partner learner of another model, was given up on (bounded copies; a partner gone for good).
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from typing import Callable

from swarm.delay import DelayConfig, sample_delay
from swarm.wire.envelope import seal
from swarm.identity import short_id
from swarm.rollouts.outbox import OWN, Outbox
from swarm.p2p import MAX_MESSAGE, SwarmNode
from swarm.p2p.framing import gated_call_s
from swarm.wire.batch import MAX_BATCH, ROLLOUTS, RolloutReply, pack_batch

log = logging.getLogger(__name__)

POLL_S = 0.25
"""The soonest a sampler with nothing due asks its learner again (an empty batch: no record
checked, no tarpit; its reply says the learner's backlog, which a sampler paused by
`max_learner_backlog` waits on to fall). At a fixed 1 s the demo's learner, 4-5 versions a second,
waited for rollouts for 46% of its time..."""
POLL_MAX_S = 4.0
"""...and the latest: a paused sampler asks once per version the learner publishes (its backlog
falls only when it steps), so a learner of minute-long steps is asked at most every 4 s by each
(1,000 paused samplers: 250 empty calls a second, against 1,000 at the fixed 1 s)."""
POLL_UNKNOWN_S = 1.0
"""The wait while the learner's pace is not known yet (no two versions seen)."""
POLL_IDLE_S = 1.0
"""The wait of a sampler that is not paused and has nothing due (between batches)."""
RETRY_WAIT_S = (0.1, 0.5)
"""Before a call whose stream ended is made again: drawn uniformly from this range (s)."""


def next_poll_s(backlog: int, pause_at: int, version_s: float) -> float:
    """How long a sampler waits before asking its learner again with nothing to send: POLL_IDLE_S
    while it is not paused (the backlog below `pause_at`: it generates, and its sends bring the
    backlog), else once per version the learner publishes (`version_s`; 0: not seen yet,
    POLL_UNKNOWN_S), within [POLL_S, POLL_MAX_S]."""
    if backlog < pause_at:
        return POLL_IDLE_S
    if version_s <= 0:
        return POLL_UNKNOWN_S
    return min(POLL_MAX_S, max(POLL_S, version_s))


class RolloutSender:
    """The sampler's side: an outbox on disk and one thread per learner that delivers what it is owed.

    Every record goes to the learner the sampler follows (`learner()`, its own model's) and to each
    of `partners()` when it is put: learners of other models that take this one's rollouts
    (docs/DESIGN.md, "Several learners"). The same signed envelope goes to each; each learner
    acknowledges it on its own, so a slow or dead partner delays nobody else. A partner's copies
    are bounded (`max_partner_owed`, the oldest given up and counted); the followed learner's never
    are (the sampler stops generating instead)."""

    def __init__(self, node: SwarmNode, outbox: Outbox, learner: Callable[[], str | None],
                 rollout_delay: DelayConfig = DelayConfig(), rng: random.Random | None = None,
                 rpc_timeout: float = 30.0, partners: Callable[[], list[str]] = lambda: [],
                 max_partner_owed: int = 256, forget_after_s: float = 600.0, pause_at: int = 32,
                 version_s: Callable[[], float] = lambda: 0.0) -> None:
        """`pause_at`: the learner backlog at which the sampler stops generating (`max_learner_backlog`);
        `version_s()`: the learner's seconds per version as the sampler sees them: while paused, idle
        polls come once per version (`next_poll_s`)."""
        self.node = node
        self.outbox = outbox
        self.learner = learner
        self.partners = partners
        self.max_partner_owed, self.forget_after_s = max_partner_owed, forget_after_s
        self._rollout_delay = rollout_delay
        self._rng = rng or random.Random(0)
        self.rpc_timeout = rpc_timeout
        self.stats: collections.Counter[str] = collections.Counter()
        """The followed learner's counts: delivered, rejected, busy, send_failures, batch_errors, and
        `retried` (calls made again because their stream ended; one that fails again is a send failure too)."""
        self.partner_stats: dict[str, collections.Counter[str]] = {}
        """The same per partner, plus `given_up` (copies dropped past `max_partner_owed` or when it left)."""
        self.learner_backlog = 0
        """The learner's backlog from its last ack: samplers pause while it is large (fresher data)."""
        self._stop = threading.Event()
        self._flushers: dict[str, threading.Thread] = {}
        self._last_reply: dict[str, float] = {}
        self.pause_at, self.version_s = pause_at, version_s
        self._poll_s = POLL_S
        """How long an idle flusher waits before polling the followed learner (POLL_S to POLL_MAX_S)."""
        self._lock = threading.Lock()
        self._start(OWN)
        for partner in self.outbox.learners():  # copies owed from before a restart
            if partner != OWN:
                self._start(partner)

    def _start(self, target: str) -> None:
        with self._lock:
            if target != OWN:
                self.partner_stats.setdefault(target, collections.Counter())
            if target in self._flushers or self._stop.is_set():
                return
            name = "outbox-flusher" if target == OWN else f"outbox-flusher-{short_id(target)}"
            self._flushers[target] = t = threading.Thread(target=self._flush_loop, args=(target,), name=name, daemon=True)
        t.start()

    def send(self, records: list[tuple[str, bytes]]) -> None:
        """Into the outbox for the learner we follow (if one is live: rows already there wait for it
        through its restarts) and a copy for each partner, whose copies are then trimmed to the bound."""
        own = self.learner()
        partners = tuple(p for p in self.partners() if p and p != own)
        to = ((OWN,) if own is not None else ()) + partners
        for rid, record in records:
            if to:
                self.outbox.put(rid, seal(self.node.identity, record), sample_delay(self._rollout_delay, self._rng),
                                to=to)
        for p in partners:
            self._start(p)
            if given_up := self.outbox.trim(p, self.max_partner_owed):
                self.partner_stats[p]["given_up"] += given_up

    def _flush_loop(self, target: str) -> None:
        backoff, away_since = 1.0, None
        stats = self.stats if target == OWN else self.partner_stats[target]
        while not self._stop.is_set():
            if target != OWN:  # a partner that left the swarm (or stopped taking our model) for good
                away_since = None if target in self.partners() else (away_since or time.monotonic())
                if away_since is not None and time.monotonic() - away_since > self.forget_after_s:
                    with self._lock:  # a copy put meanwhile is trimmed here, or finds no flusher and starts one
                        stats["given_up"] += self.outbox.trim(target, 0)
                        del self._flushers[target]
                    log.info("partner learner %s is gone: gave up the rollouts owed to it", short_id(target))
                    return
            try:
                sent = self.flush_once(target)
                backoff = 1.0
                if not sent:
                    # nothing to send, or the learner's budget for us ran out mid-batch: called again
                    # at once, the rest would meet an empty bucket at its door and wait out its
                    # tarpit (1 s); after POLL_S a quarter of a second's records have refilled. (The
                    # demo's samplers lost ~20 s each to such tarpits, their learner waiting 31-43%.)
                    self._stop.wait(POLL_S)
            except Exception as e:  # the learner is gone or slow: keep the outbox, retry later
                stats["send_failures"] += 1
                if target == OWN:  # its backlog is unknown now: the outbox's bound paces us (partners still fed)
                    self.learner_backlog = 0
                log.log(logging.WARNING if target == OWN else logging.INFO,
                        "could not deliver rollouts to %s (%s: %s); %d waiting in the outbox, retrying in %.0f s",
                        "the learner" if target == OWN else f"partner learner {short_id(target)}",
                        type(e).__name__, e, self.outbox.owed(target), backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def flush_once(self, target: str = OWN) -> int:
        """Send one batch of due records to `target` (OWN: the followed learner); returns how many it
        settled (ok or rejected), 0 if it left some busy: the caller waits before the next call."""
        learner = self.learner() if target == OWN else target
        if learner is None:
            return 0
        due = self.outbox.due(MAX_MESSAGE - 64 * 1024, MAX_BATCH, learner=target)
        if not due and (target != OWN or time.monotonic() - self._last_reply.get(target, 0.0) < self._poll_s):
            return 0
        # an empty batch is a cheap poll: it refreshes learner_backlog while we are paused
        self._last_reply[target] = time.monotonic()
        stats = self.stats if target == OWN else self.partner_stats[target]
        who = "the learner" if target == OWN else f"partner learner {short_id(target)}"
        payload = pack_batch(due)
        try:
            raw = self.node.call_gated(learner, ROLLOUTS, payload, gated_call_s(len(payload), self.rpc_timeout))
        except (ConnectionError, EOFError) as e:  # the stream ended (not a slow or failed learner):
            # once more after a moment, then the backoff. Safe: unanswered (NotAnswered), the learner
            # read none of it; answered but the reply lost, it acknowledges what it journaled again.
            # The moment, jittered: a learner shedding streams (its budget full closes them unread)
            # does not get every sampler's second try at once
            if self._stop.wait(self._rng.uniform(*RETRY_WAIT_S)):
                raise
            stats["retried"] += 1
            log.debug("the stream to %s ended (%s: %s): sending again", who, type(e).__name__, e)
            raw = self.node.call_gated(learner, ROLLOUTS, payload, gated_call_s(len(payload), self.rpc_timeout))
        reply = RolloutReply.decode(raw)
        if reply.error:  # our batch itself was refused: a bug on one side, not a busy learner
            stats["batch_errors"] += 1
            log.warning("%s refused a batch of %d rollouts: %s (kept in the outbox)", who, len(due), reply.error)
        elif reply.busy:
            log.debug("%s is busy for %d rollouts: %s", who, len(reply.busy), reply.why)
        for rid, reason in reply.rejected.items():
            log.log(logging.WARNING if target == OWN else logging.DEBUG,
                    "%s rejected rollout %s: %s (dropped from the outbox)", who, rid[:8], reason)
        if target == OWN:
            self._poll_s = next_poll_s(reply.backlog, self.pause_at, self.version_s())
            self.learner_backlog = reply.backlog
        settled = reply.ok + list(reply.rejected)
        self.outbox.remove(settled, learner=target)
        stats["delivered"] += len(reply.ok)
        stats["rejected"] += len(reply.rejected)
        stats["busy"] += len(reply.busy)
        # 0 when some were left busy: the loop pauses before trying again
        return len(settled) if due and not reply.busy else 0

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            threads = list(self._flushers.values())
        deadline = time.monotonic() + 5.0  # one bound for all: shutdown does not grow with the partners
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
