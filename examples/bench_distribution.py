"""How a new version reaches N samplers, and what it costs the learner's upload.

    python examples/bench_distribution.py [--mb 16] [--ns 1 2 4 8] [--only-stream] [--repeat 1]
    python examples/bench_distribution.py --only-manifest [--patch-mb 20] [--segment 100]

In one process: a learner and N samplers as real hivemind peers on 127.0.0.1 (each with its own
DHT process and p2pd). The learner publishes one version of `--mb` MB (a keyframe:
random bytes). Three schedules, side by side:
  staggered        samplers fetch one after another (as reload timers spread them in practice):
                   every sampler after the first takes the chunks from announced holders;
  simultaneous     all N fetch at the same instant and know their mates: each takes the chunks it
                   owns from the learner and the rest from the mates downloading them (`chunk_owner`);
  no sharing       the baseline: all N fetch at once with no mates, so each asks the learner.
For each: time until all N hold the version, and learner upload relative to one copy. Last, our
chunked, hash-checked download (1 and 4 streams) against a raw hivemind binary
stream of the same bytes between the same two peers (`--only-stream`: that section alone,
`--repeat` times, as a single run on 2 shared cores is noisy). Then what the manifest costs the
learner's upload as its chain segment grows (`--only-manifest`: that section alone): the learner
publishes a keyframe and `--segment` patches of `--patch-mb` MiB, and a sampler keeping up asks for
each new version as `join`'s do (the tail after the version it holds) and as a plain request (the
whole segment, what every reply was in hetero.manifest.v1): bytes of the reply, in learner copies of
a patch per sampler and for 8, 64 and 1,000 samplers.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from swarm.dht.network import NetworkConfig  # noqa: E402
from swarm.exchange import WeightVersion  # noqa: E402
from swarm.identity import Identity  # noqa: E402
from swarm.p2p import SwarmNode  # noqa: E402
from swarm.weights import WeightFetcher, WeightServer  # noqa: E402
from swarm.wire.chunks import chunk_size  # noqa: E402
from swarm.wire.manifest import MANIFEST, ManifestRequest, TailNotice  # noqa: E402
from swarm.weights.server import TAIL_RELAYS  # noqa: E402


def make_version(mb: int, chain: str) -> WeightVersion:
    """Version 0 of `chain`: a keyframe of `mb` MiB of random bytes. The transfer treats a blob as
    opaque bytes, so no codec is needed; random bytes are as incompressible as fp32 weights."""
    return WeightVersion("bench", chain, 0, None, random.randbytes(mb * 1024 * 1024))


def fetch_all(samplers, simultaneous: bool) -> float:
    for s in samplers:
        s.store.reset("")
    t0 = time.perf_counter()
    if simultaneous:
        threads = [threading.Thread(target=s.fetch, args=("", -1)) for s in samplers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for s in samplers:
            s.fetch("", -1)
            time.sleep(0.3)  # let its holder record reach the DHT (counted in the time)
    return time.perf_counter() - t0


def raw_stream_mb_s(a: SwarmNode, b: SwarmNode, payload: bytes) -> float:
    from hivemind.p2p import P2P, PeerID

    async def handler(stream_info, reader, writer):
        await P2P.send_raw_data(payload, writer)
        writer.close()

    async def fetch():
        _, reader, writer = await b.p2p.call_binary_stream_handler(PeerID.from_base58(a.peer_id), "bench.raw")
        data = await P2P.receive_raw_data(reader)
        writer.close()
        return data

    a.run(a.p2p.add_binary_stream_handler("bench.raw", handler), timeout=10)
    t0 = time.perf_counter()
    data = b.run(fetch(), timeout=120)
    a.run(a.p2p.remove_binary_stream_handler("bench.raw"), timeout=10)  # so that --repeat can set it again
    assert len(data) == len(payload)
    return len(payload) / 1e6 / (time.perf_counter() - t0)


def stream_vs_raw(ln: SwarmNode, lx: WeightServer, sx: WeightFetcher, mb: int, run: int = 0) -> dict[str, float]:
    """Our chunked, hash-checked download from the learner against a raw hivemind stream: MB/s.
    Each run publishes a chain of its own, as a restarted learner does: the learner's chunk door serves
    one peer a chunk of a version at most MAX_REPEATS (3) times, and every run fetches each chunk twice,
    so a second run of one chain ended in chunks "verified from no source"."""
    wv = make_version(mb, f"raw{run}")
    blob = wv.blob
    lx.publish(wv)
    rates = {"raw": raw_stream_mb_s(ln, sx.node, blob)}
    sx._holders = lambda chain: {}  # measure the learner path alone
    for name, parallel in (("1 stream", 1), ("4 streams", 4)):
        sx._pool, sx._parallel = ThreadPoolExecutor(parallel), parallel  # as if made with parallel=...
        sx.store.reset("")
        t0 = time.perf_counter()
        assert [w.blob for w in sx.fetch("", -1) or []] == [blob]
        rates[name] = len(blob) / 1e6 / (time.perf_counter() - t0)
    rates["raw"] = (rates["raw"] + raw_stream_mb_s(ln, sx.node, blob)) / 2  # before and after: less noise
    print(f"\none peer to one peer, {len(blob) / 1e6:.0f} MB, raw hivemind stream {rates['raw']:.0f} MB/s:")
    for name, rate in rates.items():
        if name != "raw":
            print(f"  chunked, hash-checked, {name}: {rate:.0f} MB/s, ratio to raw stream {rate / rates['raw']:.2f}")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=16)
    ap.add_argument("--ns", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--only-stream", action="store_true", help="only the one-peer-to-one-peer comparison")
    ap.add_argument("--repeat", type=int, default=1, help="times to run the one-peer-to-one-peer comparison")
    ap.add_argument("--only-manifest", action="store_true", help="only the manifest's cost as the segment grows")
    ap.add_argument("--patch-mb", type=int, default=20, help="MiB of each patch in the manifest section "
                    "(20: a 0.6B model's at lr 1e-6, 80 chunks)")
    ap.add_argument("--segment", type=int, default=100, help="patches after the keyframe in the manifest section")
    args = ap.parse_args()
    if args.only_stream:
        args.ns = [1]
    if args.only_manifest:
        args.ns = [2]  # a relay, and a sampler the learner sends a notice
    tmp = Path(tempfile.mkdtemp())
    ln = SwarmNode(Identity.load_or_create(tmp / "l.key"), NetworkConfig(), "bench")
    lx = WeightServer(ln)
    nodes = [SwarmNode(Identity.load_or_create(tmp / f"s{i}.key"), NetworkConfig(initial_peers=ln.maddrs()), "bench")
             for i in range(max(*args.ns, 2))]  # (two at least: the manifest section asks with two)
    mates: list[str] = []
    samplers = [WeightFetcher(n, lambda: ln.peer_id, mates=lambda: mates) for n in nodes]
    try:
        if args.only_manifest:
            manifest_cost(args, lx, nodes[0], nodes[1])
            return
        if not args.only_stream:
            distribution(args, lx, samplers, mates)
        mates[:] = []
        runs = []
        for run in range(args.repeat):
            # a sampler of its own key each time, as a new volunteer: one key's manifest asks are a
            # door's 1 a second (burst 8), which the schedules above and two fetches a run exhaust
            node = SwarmNode(Identity.load_or_create(tmp / f"one{run}.key"), NetworkConfig(initial_peers=ln.maddrs()),
                             "bench")
            fetcher = WeightFetcher(node, lambda: ln.peer_id, mates=lambda: [])
            try:
                runs.append(stream_vs_raw(ln, lx, fetcher, args.mb, run))
            finally:
                fetcher.close()
                node.shutdown()
        if len(runs) > 1:
            ratios = {name: statistics.median(r[name] / r["raw"] for r in runs) for name in runs[0] if name != "raw"}
            print(f"\nmedian of {len(runs)}: " + ", ".join(f"{name} {q:.2f}x raw" for name, q in ratios.items()))
        if not args.only_stream:
            manifest_cost(args, lx, nodes[0], nodes[1])
    finally:
        for s in samplers:
            s.close()
        for n in reversed([ln, *nodes]):
            n.shutdown()


def distribution(args, lx: WeightServer, samplers: list[WeightFetcher], mates: list[str]) -> None:
    """The three schedules for each N: time until all N hold the version, and learner upload."""
    print(f"version size {args.mb} MB; learner + up to {max(args.ns)} samplers on 127.0.0.1, 2 CPU cores")
    print(f"{'N':>3} {'schedule':>13} {'time to all s':>14} {'learner upload':>15}")
    # the learner's door serves them as proven, as it does samplers whose first groups passed their
    # audits (a mate's have: the learner credits it): fresh keys share one
    # 64 MiB burst (swarm/p2p/doors.py, CHUNKS), which 8 of them taking 16 MB each at once outrun, so
    # the no-sharing baseline would measure refusals, not N copies
    ids = {x.node.peer_id for x in samplers}
    lx.node.doors.set_proven(lambda peer: peer in ids)
    run = 0
    for n in args.ns:
        for schedule in ("staggered", "simultaneous", "no sharing"):
            run += 1
            mates[:] = [x.node.peer_id for x in samplers[:n]] if schedule != "no sharing" else []
            wv = make_version(args.mb, f"c{run}")
            lx.publish(wv)
            before = lx.store.served_bytes
            secs = fetch_all(samplers[:n], schedule != "staggered")
            copies = (lx.store.served_bytes - before) / len(wv.blob)
            print(f"{n:>3} {schedule:>13} {secs:14.2f} {copies:13.2f}x")
    stats = sum((x.stats for x in samplers), collections.Counter())
    print(f"fetch failures {stats['weight_fetch_failures']}, chunks a source did not hold (asked of the next) "
          f"{stats['chunks_not_held']}, bad chunks {stats['bad_chunks']}")


def manifest_cost(args, lx: WeightServer, asker: SwarmNode, reader: SwarmNode) -> None:
    """Reply bytes of a manifest request as the segment grows, in copies of one patch: the tail a
    sampler keeping up is sent (hetero.manifest.v3) if it is a relay or takes no notices, the notice
    naming the relays that a sampler taking notices is sent instead, and the whole segment (every
    reply in v1). Both askers are proven and the learner names one relay (`asker`); a notice naming
    TAIL_RELAYS relays is longer by one peer id for each further one."""
    chain, patch = "manifest", random.randbytes(args.patch_mb * 1024 * 1024)  # one blob: memory stays flat
    lx.node.doors.set_proven(lambda peer: True)
    lx.relays = 1
    lx.publish(WeightVersion("bench", chain, 0, None, patch))
    marks = sorted({m for m in (1, 10, 25, 50, 100, 200, args.segment) if m <= args.segment})
    per_relay = len(msgpack.packb(asker.peer_id))
    print(f"\nthe manifest as the segment grows: a keyframe then {args.segment} patches of {args.patch_mb} MiB "
          f"({-(-len(patch) // chunk_size(len(patch)))} chunks each), two samplers asking")
    print(f"{'patches':>7} {'tail B':>8} {'notice B':>9} {'whole B (v1)':>12} | learner copies a version: "
          f"{'tail each, 8':>12} {'64':>6} {'1000':>6} | {TAIL_RELAYS} tails + notices, {'64':>5} {'1000':>6} | "
          f"{'whole, 64':>9} {'1000':>6}")
    for v in range(1, args.segment + 1):
        lx.publish(WeightVersion("bench", chain, v, v - 1, patch))
        if v not in marks:
            continue
        tail = asker.call(lx.node.peer_id, MANIFEST, ManifestRequest(chain, v - 1, 0.0, relay=True).encode(), 30.0)
        notice = reader.call(lx.node.peer_id, MANIFEST, ManifestRequest(chain, v - 1, 0.0, notice=True).encode(), 30.0)
        whole = asker.call(lx.node.peer_id, MANIFEST, b"", 30.0)
        assert tail and whole, "a manifest ask was answered b\"\" (past the door's budget)"
        assert TailNotice.is_notice(notice) and not TailNotice.is_notice(tail), "the learner did not name its relay"
        named = len(notice) + (TAIL_RELAYS - 1) * per_relay  # a notice naming every relay
        t, w = len(tail) / len(patch), len(whole) / len(patch)

        def relayed(n: int) -> float:
            return (min(n, TAIL_RELAYS) * len(tail) + max(0, n - TAIL_RELAYS) * named) / len(patch)

        print(f"{v:>7} {len(tail):>8,} {len(notice):>9,} {len(whole):>12,} | {'':>25}{8 * t:>12.3f} {64 * t:>6.2f} "
              f"{1000 * t:>6.2f} | {'':>19}{relayed(64):>5.3f} {relayed(1000):>6.3f} | {64 * w:>9.2f} {1000 * w:>6.1f}")
        time.sleep(2.0)  # two asks a mark, within the manifest door's 1 call a second for one key
    print(f"copies: reply bytes over one patch's, which the learner uploads once per version at best. A sampler "
          f"keeping up is sent the tail once a version (a long poll that ends with nothing newer: b\"\"), or, once the "
          f"tail's {TAIL_RELAYS} relays are named, a notice of {len(notice) - per_relay:,} B and {per_relay} B a relay "
          f"it names (the relays then serve it the tail: hetero.tail.v1)")

if __name__ == "__main__":
    main()
