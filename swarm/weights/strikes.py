"""Chunk sources that failed a fetcher, benched with exponential backoff (`PeerStrikes`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PeerStrikes:
    """Peers that failed us, benched with exponential backoff: the n-th strike in a row benches a
    peer for min(base * 2^(n-1), cap) seconds; strikes while benched count once (one offence, e.g.
    four streams stalling together, is one strike); a peer clean for `forget` s starts again at n=1.
    Not thread-safe: the fetcher holds its lock."""

    base: float
    cap: float
    forget: float
    _strikes: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    """peer -> (strikes in a row, time of the last, benched until)."""

    def strike(self, peer: str, now: float) -> bool:
        """Record a failure of `peer` at `now`; True if it counted (the peer was not benched)."""
        n, last, until = self._strikes.get(peer, (0, -float("inf"), -float("inf")))
        if now < until:
            return False
        n = 1 if now - last > self.forget else n + 1
        self._strikes[peer] = (n, now, now + min(self.base * 2 ** (n - 1), self.cap))
        return True

    def benched(self, peer: str, now: float) -> bool:
        return now < self._strikes.get(peer, (0, 0.0, -float("inf")))[2]

    def strikes(self, peer: str, now: float) -> int:
        n, last, _ = self._strikes.get(peer, (0, -float("inf"), 0.0))
        return 0 if now - last > self.forget else n

    def order(self, peers: list[str], now: float) -> list[str]:
        """`peers` without the benched ones, those with fewer recent strikes first (stable)."""
        return sorted((p for p in peers if not self.benched(p, now)), key=lambda p: self.strikes(p, now))
