"""Many fresh keys at once, as an attacker would run them: for
tests/integration/swarm/test_intake_wire.py and examples/bench_flood.py.

Each key is a bare libp2p host (hivemind's `P2P`, one p2pd each) dialled straight to the learner,
without a DHT of its own: keys are free, and so, nearly, is a peer per key. All of them share one
event loop in a background thread; `call` and `flood` block, with timeouts.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from pathlib import Path

import msgpack
from hivemind.p2p import P2P, PeerID

from swarm.identity import Identity
from swarm.p2p import call_gated
from swarm.wire.batch import ROLLOUTS


class Sybils:
    def __init__(self, n: int, learner_maddrs: list[str], workdir: Path, eager: bool = False) -> None:
        self.eager = eager
        """Send each batch without waiting for the learner's door (as a flooder would)."""
        self.identities = [Identity.load_or_create(Path(workdir) / f"sybil{i}.key") for i in range(n)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sybils", daemon=True)
        self._thread.start()
        self.p2ps: list[P2P] = self._run(_gather(*[
            P2P.create(initial_peers=learner_maddrs, identity_path=str(ident.path),
                       host_maddrs=["/ip4/127.0.0.1/tcp/0"], auto_nat=False, nat_port_map=False)
            for ident in self.identities]), 120)

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(asyncio.wait_for(coro, timeout), self._loop).result(timeout + 5)

    async def _call(self, i: int, learner: str, payload: bytes) -> dict:
        reply = await call_gated(self.p2ps[i], learner, ROLLOUTS, payload, eager=self.eager)
        return msgpack.unpackb(reply, raw=False)

    def call(self, i: int, learner: str, payload: bytes, timeout: float = 60) -> dict:
        """Key `i` sends one rollout batch (raw bytes) to `learner`; its reply."""
        return self._run(self._call(i, learner, payload), timeout)

    def call_all(self, learner: str, payloads: dict[int, bytes], timeout: float = 120) -> list[dict]:
        """Keys at once, key i sending payloads[i]; their replies in the order of `payloads`."""
        return self._run(_gather(*[self._call(i, learner, p) for i, p in payloads.items()]), timeout)

    def flood(self, learner: str, batches: dict[int, list[bytes]], seconds: float, concurrency: int = 1) -> dict:
        """Each key i of `batches` sends its batches (raw payloads, round and round), `concurrency`
        calls at a time, as fast as the learner answers, for `seconds`; what came back, summed by
        `tally` ("ok": records accepted, "acked_again": ids acknowledged again unopened, "why":
        replies by the bound they name, "error": by the batch error, "reasons": refused items by
        reason; `opened` says how many the learner checked)."""
        counts, acked = new_counts(), set()
        sizes = {b: _items_in(b) for own in batches.values() for b in own}

        async def one(i: int, deadline: float) -> None:
            j = 0
            while time.monotonic() < deadline:
                batch = batches[i][j % len(batches[i])]
                j += 1
                try:
                    reply = await asyncio.wait_for(self._call(i, learner, batch), 60)
                except Exception:  # a timeout or a reset: an attacker just calls again
                    counts["failed_calls"] += 1
                    continue
                counts["calls"], counts["sent"], counts["bytes"] = (counts["calls"] + 1, counts["sent"] + sizes[batch],
                                                                    counts["bytes"] + len(batch))
                tally(counts, acked, i, reply)

        deadline = time.monotonic() + seconds
        self._run(_gather(*[one(i, deadline) for i in batches for _ in range(concurrency)]), seconds + 120)
        # a call answered unread lists no ids
        counts["busy"] = counts["sent"] - counts["ok"] - counts["acked_again"] - counts["rejected"]
        return counts

    def liars(self, keys: list[int], learner: str, declared: int, seconds: float):
        """Keys `keys` declare `declared` payload bytes on the rollout gate, one call after another
        for `seconds`, and never send them (a slow read holds each until the learner's body bound
        cuts it). Runs in the background; the future's result: {"go": calls let in, "busy": ...}."""
        from swarm.p2p.framing import read_reply, send_ask

        counts = collections.Counter()

        async def one(i: int, deadline: float) -> None:
            while time.monotonic() < deadline:
                try:
                    _, reader, writer = await self.p2ps[i].call_binary_stream_handler(PeerID.from_base58(learner),
                                                                                         ROLLOUTS)
                    await send_ask(writer, declared)
                    answer = await asyncio.wait_for(read_reply(reader, ROLLOUTS, learner, 1 << 20), 30)
                    counts["busy" if answer else "go"] += 1
                    if not answer:  # let in: send nothing, wait for the learner to give up on us
                        await asyncio.wait_for(reader.read(), 120)
                    writer.close()
                except Exception:  # a reset or a timeout: the liar just calls again
                    counts["failed"] += 1
                    await asyncio.sleep(0.1)

        deadline = time.monotonic() + seconds
        return asyncio.run_coroutine_threadsafe(_gather(*[one(i, deadline) for i in keys]), self._loop), counts

    def shutdown(self) -> None:
        try:
            self._run(_gather(*[p.shutdown() for p in self.p2ps], return_exceptions=True), 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


def new_counts() -> dict:
    """What `tally` sums, from nothing (plain ints, dicts and a Counter: it dumps to JSON)."""
    return {"calls": 0, "sent": 0, "bytes": 0, "ok": 0, "acked_again": 0, "rejected": 0, "failed_calls": 0,
            "why": {}, "error": {}, "reasons": collections.Counter()}


def tally(counts: dict, acked: set[tuple[int, str]], i: int, reply: dict) -> None:
    """Key `i`'s `reply` added to `counts`; `acked`: the (key, id) acknowledged so far.

    An id the learner acknowledged to this key before comes back in "ok" on every call that sends it
    again, unopened: the receiver takes it for a batch whose ack was lost and acknowledges it again,
    with no check and nothing taken from any budget (swarm/rollouts/receiver.py, `_settle`). It is
    counted as "acked_again", not as "ok": a key that resends its batches would otherwise seem to
    have each of its accepted records checked again on every call let past the door (in
    tests/unit/swarm/test_intake.py, one key's 16 accepted ids, acknowledged again on its 19 later calls, made
    the learner's 95 checks look like 399). The first "ok" of an id is its one check, even where the
    reply of the call that checked it was lost."""
    for rid in reply.get("ok", []):
        if (i, rid) in acked:
            counts["acked_again"] += 1
        else:
            acked.add((i, rid))
            counts["ok"] += 1
    counts["rejected"] += len(reply.get("rejected", {}))
    counts["reasons"].update(reply.get("rejected", {}).values())
    for k in ("why", "error"):
        if reply.get(k):
            counts[k][reply[k]] = counts[k].get(reply[k], 0) + 1


def opened(counts: dict) -> int:
    """Records the learner opened and checked, what its unproven pool bounds: those accepted and
    those refused, not those acknowledged again (`tally`) nor those of a key refused for good (its
    items are refused by id, unopened; a few refused_sampler may have been checked, by the learner's
    own check: not counted)."""
    return counts["ok"] + counts["rejected"] - counts["reasons"]["refused_sampler"]


def batches_of(items: list[list], size: int = 256) -> list[bytes]:
    """A pool of [id, envelope] items as packed batches of at most `size` (signed and packed once)."""
    return [msgpack.packb(items[k:k + size]) for k in range(0, len(items), size)]


def _items_in(batch: bytes) -> int:
    try:
        items = msgpack.unpackb(batch, raw=False)
    except Exception:  # garbage: no items
        return 0
    return len(items) if isinstance(items, list) else 0


async def _gather(*coros, return_exceptions: bool = False) -> list:
    """asyncio.gather inside the loop that runs it (gather itself binds to the caller's loop)."""
    return await asyncio.gather(*coros, return_exceptions=return_exceptions)


def learner_maddrs(peers: list[dict], learner: str) -> list[str]:
    """The learner's announced addresses, each with its /p2p/ id (to dial it directly)."""
    maddrs = [m for p in peers if p.get("peer_id") == learner for m in p.get("maddrs", [])]
    return [m if "/p2p/" in m else f"{m}/p2p/{learner}" for m in maddrs]
