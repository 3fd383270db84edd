"""The leaderboard: tallies only learners can sign, a SQLite history, a page checked in a real browser.

Unit tests (fast): the store's rules (newest tally per learner, replays / self-credit / untrusted /
malformed refused and counted, history kept across a restart), escaping of untrusted names (once,
in the one place rows are rendered), the HTTP service (the refresh fragment is the first load's
rows; a port in use fails at once), and the DHT validator chain every peer runs (forged, edited,
self-crediting tallies refused; a learner's version and eval accepted in bounds, refused out of
them, and older tallies without them still accepted); the learners' progress kept and charted.
Integration: real in-process DHT peers refuse forged tallies; a loopback swarm's tallies (with the
learner's version and eval) reach the page, checked in headless Chromium (screenshot saved), and
survive a restart of the service, which then says it shows stored history; the page read at phone
and desktop widths in Chromium (screenshots saved).
"""

from __future__ import annotations

import dataclasses
import base64
import contextlib
import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.schema import SchemaValidator
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from helpers.external import require_chromium
from node.accounting import Tally
from swarm.dht import NetworkConfig, SwarmSchema, own_key
from swarm.identity import Identity, short_id
from swarm.leaderboard import (LeaderboardServer, LeaderboardStore, clean_name, collect_once, render_chart,
                               render_learning_chart, render_page, render_rows, serve)
from swarm.leaderboard.page import HISTORY_ONLY
from swarm.ownership import MAX_TTL, OwnerValidator, owner_peer_id

ARTIFACTS = Path(os.environ.get("HETERO_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "runs" / "test-artifacts"))


def tally(learner: str, seq: int, peers: dict[str, tuple[int, int]], t: float = 1000.0) -> dict:
    return {"learner": learner, "seq": seq, "time": t, "model_id": "m",
            "peers": {p: {"groups": r // 4, "rollouts": r, "tokens": tok, "first": t - 10.0, "last": t, "models": ["m"]}
                      for p, (r, tok) in peers.items()}}


def progress(t: dict, version: int, acc: float | None = None, at: int | None = None) -> dict:
    """`t` as a learner's tally that also says its version and (acc, at) its latest eval."""
    return {**t, "version": version, **({} if acc is None else {"eval_acc": acc, "eval_version": at})}


# ---- the store ---------------------------------------------------------------------------------------

def test_store_sums_learners_ranks_peers_and_keeps_only_the_newest_tally(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    assert store.ingest(tally("L1", 1, {"A": (8, 40)}, t=1000.0)) == "new"
    assert store.ingest(tally("L1", 2, {"A": (16, 80), "B": (4, 12)}, t=1010.0)) == "new"
    assert store.ingest(tally("L2", 5, {"B": (24, 100)}, t=1020.0)) == "new"
    assert store.ingest(tally("L2", 5, {"B": (24, 100)}, t=1020.0)) == "unchanged"  # read again next poll
    board = store.board()
    assert [(p["peer_id"], p["rollouts"], p["tokens"], p["rank"]) for p in board["peers"]] == \
        [("B", 28, 112, 1), ("A", 16, 80, 2)]  # cumulative per learner: L1's newest tally, not the sum of both
    assert board["total_rollouts"] == 44 and board["learners"] == 2
    assert board["peers"][0]["share"] == pytest.approx(28 / 44)
    assert store.history()["A"] == [(1000.0, 8), (1010.0, 16)]
    assert store.history()["B"] == [(1010.0, 4), (1020.0, 28)]


def test_board_splits_each_peers_credit_by_learner_and_says_what_each_learner_credited(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(progress({**tally("L1", 1, {"A": (16, 80), "B": (4, 12)}), "model_id": "m1"}, 3, 0.5, 3))
    store.ingest(progress({**tally("L2", 1, {"B": (24, 100)}), "model_id": "m2"}, 7, 0.25, 6))
    store.set_name("L2", "<b>two</b>")
    board = store.board()
    by = {p["peer_id"]: p["by_learner"] for p in board["peers"]}
    assert by == {"A": {"L1": 16}, "B": {"L1": 4, "L2": 24}}  # B's 28 = 4 credited by L1 + 24 by L2
    credit = {x["learner"]: (x["model_id"], x["rollouts"], x["contributors"]) for x in board["learner_progress"]}
    assert credit == {"L1": ("m1", 20, 2), "L2": ("m2", 24, 1)}
    rows = render_rows(board)
    # names escaped once, learners in name order (a peer id's short form sorts by the id)
    assert '<td class="name">&lt;b&gt;two&lt;/b&gt;: 24 · …L1: 4</td>' in rows, rows
    assert "Learner &lt;b&gt;two&lt;/b&gt; (m2): version 7, eval accuracy 25.0% at version 6, 24 credited rollouts " \
           "from 1 peer(s)." in rows


def test_store_refuses_replays_self_credit_untrusted_and_malformed_tallies_and_counts_them(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 10, {"A": (40, 100)}))
    assert store.ingest(tally("L1", 3, {"A": (400, 1000)})) == "replay"  # an old signed tally, resent
    assert store.ingest(tally("L1", 11, {"L1": (99, 99)})) == "self_credit"
    assert store.ingest(tally("L9", 1, {"A": (5, 5)}), trusted={"L1"}) == "untrusted"
    bad = tally("L1", 12, {"A": (1, 1)})
    bad["peers"]["A"]["rollouts"] = -5
    assert store.ingest(bad) == "invalid"
    assert store.ingest({"learner": "L1"}) == "invalid"
    assert store.board()["peers"][0]["rollouts"] == 40  # nothing refused changed the board
    assert store.counters() == {"accepted": 1, "replay": 1, "self_credit": 1, "untrusted": 1, "invalid": 2}


def test_history_names_and_counters_survive_a_restart(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 1, {"A": (8, 40)}))
    store.set_name("A", "alice\x00\u202e")
    before = (store.board(), store.history(), store.counters())
    store.close()
    again = LeaderboardStore(tmp_path / "lb.db")
    assert (again.board(), again.history(), again.counters()) == before
    assert again.board()["peers"][0]["name"] == "alice"  # control and bidi-override characters removed


def test_untrusted_names_are_escaped_in_the_page_and_the_chart(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 1, {"A": (8, 40)}))
    evil = '<script>alert(1)</script>&"'
    store.set_name("A", evil)
    page = render_page(store.board(), swarm="<b>demo</b>")
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;" in page
    assert "<b>demo</b>" not in page
    chart = render_chart(store.history(), {"A": evil})
    assert "<script>" not in chart and "&lt;script&gt;" in chart
    assert clean_name("x" * 100) == "x" * 64
    assert "no credited rollouts yet" in render_chart({}, {})


def test_rows_escape_a_hostile_name_exactly_once_and_the_page_embeds_those_rows(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    peer = "12D3KooWPeerWithALongIdABCDEFGH"
    store.ingest(tally("L1", 1, {peer: (8, 40)}))
    store.set_name(peer, '<img src=x onerror="alert(1)">&amp;')
    rows = render_rows(store.board())
    assert rows.startswith("<tbody") and rows.endswith("</tbody>")
    assert '<td class="name">&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;</td>' in rows
    assert "<img" not in rows and "&amp;lt;" not in rows and "&amp;amp;amp;" not in rows  # escaped once, not twice
    assert f'<td title="{peer}">{short_id(peer)}</td>' in rows  # short id shown, full id on hover
    assert 'data-summary="1 peer(s), 8 credited rollouts, 1 learner(s)."' in rows
    assert rows in render_page(store.board(), swarm="demo")  # the page's first load is the same fragment
    plain = LeaderboardStore(tmp_path / "plain.db")
    plain.ingest(tally("L1", 1, {"A": (8, 40)}))
    plain.set_name("A", 'Tom & "Jerry"')
    assert '<td class="name">Tom &amp; &quot;Jerry&quot;</td>' in render_rows(plain.board())
    assert "&amp;amp;" not in render_page(plain.board(), swarm="demo")


def _get(url: str) -> tuple[str, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode(), dict(r.headers)


def test_rows_route_serves_the_rows_of_the_first_render_and_the_csp_allows_only_the_pages_script(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 1, {"A": (8, 40), "B": (4, 12)}))
    store.set_name("A", "<b>alice</b>")
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, refresh_s=5.0) as server:
        url = server.url
        page, headers = _get(url)
        rows, _ = _get(url + "rows")
        assert rows.startswith("<tbody") and rows.count("<tr>") == 2
        assert rows in page and rows == render_rows(store.board())
        csp = headers["Content-Security-Policy"]
        script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["script-src"] == f"'sha256-{digest}'"  # that script runs, no other inline one would
        assert "innerHTML" in script and "insertCell" not in script  # it swaps server rows in, never builds cells
        assert json.loads(_get(url + "api/leaderboard")[0])["total_rollouts"] == 12
        assert _get(url + "chart.svg")[0].startswith("<svg")
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(url + "nope")
        assert e.value.code == 404


class _FakeSwarm:
    """A source like SwarmNode: a coordinator naming L1, tallies and PeerInfos, without a DHT."""

    coordinators = {"C"}

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]:
        return {"L1": ""} if coordinators == {"C"} else {}

    def tally_of(self, learner: str) -> dict | None:
        return {"L1": tally("L1", 1, {"A": (8, 40)}), "L2": tally("L2", 1, {"A": (99, 99)})}.get(learner)

    def peers(self) -> list[dict]:
        return [{"peer_id": "A", "name": "alice"}]


def test_serve_collects_from_its_source_until_stopped_and_frees_the_port(tmp_path):
    store, stop, urls = LeaderboardStore(tmp_path / "lb.db"), threading.Event(), []
    t = threading.Thread(target=serve, args=(store, "demo", "127.0.0.1", 0, stop),
                         kwargs={"source": _FakeSwarm(), "poll_s": 0.05, "ready": urls.append}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not (urls and store.board()["peers"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    board = json.loads(_get(urls[0] + "api/leaderboard")[0])
    # 8 from L1, which the coordinator names; L2's tally (99 more) is never read
    assert [(p["peer_id"], p["name"], p["rollouts"]) for p in board["peers"]] == [("A", "alice", 8)]
    stop.set()
    t.join(timeout=5)
    assert not t.is_alive()
    port = int(urls[0].rsplit(":", 1)[1].strip("/"))
    with socket.create_server(("127.0.0.1", port)):  # released, so a restart can take it again
        pass
    assert store.board()["peers"]  # the store is the caller's: still open


def test_serve_on_a_port_in_use_raises_oserror_before_anything_starts(tmp_path):
    store, called = LeaderboardStore(tmp_path / "lb.db"), []
    with socket.create_server(("127.0.0.1", 0)) as taken:
        start = time.monotonic()
        with pytest.raises(OSError):
            serve(store, "demo", "127.0.0.1", taken.getsockname()[1], threading.Event(), source=_FakeSwarm(),
                  ready=called.append)
    assert time.monotonic() - start < 2 and not called and not store.board()["peers"]


def test_collector_takes_tallies_and_display_names(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    out = collect_once(store, lambda: [tally("L1", 1, {"A": (8, 40)}), tally("L1", 0, {"A": (99, 9)})],
                       lambda: [{"peer_id": "A", "name": "alice"}, {"peer_id": "L1", "name": ""}])
    assert out == {"new": 1, "replay": 1}
    assert store.board()["peers"][0]["name"] == "alice"


# ---- the validator chain every DHT peer runs ---------------------------------------------------------

def _chain(identity: Identity) -> CompositeValidator:
    return CompositeValidator([RSASignatureValidator(identity.dht_private_key()),
                               SchemaValidator(SwarmSchema, prefix="hetero_t"), OwnerValidator("t")])


def _record(signer: Identity, owner: Identity, value: dict, key: str | None = None, prefix: bytes = b"",
            ttl: float = 60.0) -> DHTRecord:
    """`value` under `key` (default: the owner's own tally key), signed by `signer` as `owner`'s."""
    key = key or own_key("t", "tally", owner.peer_id)
    subkey = prefix + RSASignatureValidator(owner.dht_private_key()).local_public_key
    record = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                       MSGPackSerializer.dumps(value), get_dht_time() + ttl)
    return DHTRecord(record.key, record.subkey, _chain(signer).sign_value(record), record.expiration_time)


def test_validators_accept_a_learners_own_tally_and_refuse_forged_edited_and_self_credit(tmp_path):
    learner, forger = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("l", "f"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    t = Tally()
    t.credit("sampler-A", 8, 40, "m")
    good = _record(learner, learner, t.record(learner.peer_id, "m"))
    assert owner_peer_id(MSGPackSerializer.loads(good.subkey)) == learner.peer_id
    assert reader.validate(good)
    edited = DHTRecord(good.key, good.subkey, good.value.replace(b"sampler-A", b"sampler-Z"), good.expiration_time)
    assert not reader.validate(edited)  # value changed after signing
    # under the learner's subkey but signed by another key (hivemind signs only its own subkeys)
    assert not reader.validate(_record(forger, learner, t.record(learner.peer_id, "m")))
    # the forger's own subkey, claiming to be the learner
    assert not reader.validate(_record(forger, forger, t.record(learner.peer_id, "m")))
    # a learner crediting itself
    t.credit(learner.peer_id, 8, 40, "m")
    selfish = t.record(learner.peer_id, "m")
    selfish["peers"][learner.peer_id] = selfish["peers"]["sampler-A"]
    assert not reader.validate(_record(learner, learner, selfish))
    assert learner.peer_id not in t.record(learner.peer_id, "m")["peers"]  # and Tally never writes one


def test_validators_accept_a_learners_version_and_eval_and_still_accept_a_tally_without_them(tmp_path):
    learner = Identity.load_or_create(tmp_path / "l.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    t = Tally()
    t.credit("sampler-A", 8, 40, "m")
    history = [{"kind": "eval", "version": 0, "eval_acc": 0.25}, {"kind": "step", "version": 1},
               {"kind": "eval", "version": 3, "eval_acc": 0.625}, {"kind": "step", "version": 4}]
    value = t.record(learner.peer_id, "m", 4, history)
    assert (value["version"], value["eval_acc"], value["eval_version"]) == (4, 0.625, 3)  # the latest eval
    assert reader.validate(_record(learner, learner, value))
    before_eval = t.record(learner.peer_id, "m", 0, [])
    assert "eval_acc" not in before_eval and reader.validate(_record(learner, learner, before_eval))
    older = t.record(learner.peer_id, "m")  # as a learner from before these fields publishes it
    assert "version" not in older and reader.validate(_record(learner, learner, older))
    signed = _record(learner, learner, value)
    edited = signed.value.replace(MSGPackSerializer.dumps(value), MSGPackSerializer.dumps({**value, "eval_acc": 0.99}))
    assert edited != signed.value
    assert not reader.validate(DHTRecord(signed.key, signed.subkey, edited, signed.expiration_time))  # after signing


BAD_PROGRESS = {
    "accuracy above 1": {"version": 4, "eval_acc": 1.5, "eval_version": 3},
    "accuracy below 0": {"version": 4, "eval_acc": -0.01, "eval_version": 3},
    "accuracy NaN": {"version": 4, "eval_acc": math.nan, "eval_version": 3},
    "accuracy infinite": {"version": 4, "eval_acc": math.inf, "eval_version": 3},
    "accuracy an int": {"version": 4, "eval_acc": 1, "eval_version": 3},
    "negative version": {"version": -1},
    "version a float": {"version": 4.0},
    "negative eval version": {"version": 4, "eval_acc": 0.5, "eval_version": -1},
    "eval newer than the version": {"version": 4, "eval_acc": 0.5, "eval_version": 5},
    "accuracy without its version": {"version": 4, "eval_acc": 0.5},
    "eval without a current version": {"eval_acc": 0.5, "eval_version": 3},
}


@pytest.mark.parametrize("why", list(BAD_PROGRESS))
def test_validators_and_the_store_refuse_a_learners_out_of_range_or_incoherent_eval(tmp_path, why):
    learner = Identity.load_or_create(tmp_path / "l.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    bad = {**tally(learner.peer_id, 5, {"sampler-A": (8, 40)}), **BAD_PROGRESS[why]}
    assert not reader.validate(_record(learner, learner, bad)), f"the DHT took a tally with {why}: {bad}"
    store = LeaderboardStore(tmp_path / "lb.db")
    assert store.ingest(bad) == "invalid", why
    assert store.learners() == [] and store.counters() == {"invalid": 1}


def test_store_keeps_each_learners_version_and_eval_a_point_per_change_across_a_restart(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 1, {"A": (8, 40)}, t=1000.0))  # from before the fields: no progress point
    store.ingest(progress(tally("L1", 2, {"A": (16, 80)}, t=1010.0), 2, 0.25, 0))
    store.ingest(progress(tally("L1", 3, {"A": (16, 80)}, t=1020.0), 2, 0.25, 0))  # nothing changed: no point
    store.ingest(progress(tally("L1", 4, {"A": (24, 99)}, t=1030.0), 5))  # a resumed learner, no eval yet
    store.ingest(progress(tally("L1", 5, {"A": (32, 120)}, t=1040.0), 7, 0.5, 6))
    assert store.ingest(progress(tally("L1", 3, {"A": (99, 999)}, t=1050.0), 99, 1.0, 99)) == "replay"
    store.ingest(tally("L2", 1, {"B": (4, 4)}, t=1015.0))
    store.set_name("L1", "learner one")
    want = [{"learner": "L1", "name": "learner one", "model_id": "m", "updated": 1040.0, "version": 7,
             "eval_acc": 0.5, "eval_version": 6,
             "progress": [(1010.0, 2, 0.25, 0), (1030.0, 5, None, None), (1040.0, 7, 0.5, 6)]},
            {"learner": "L2", "name": "", "model_id": "m", "updated": 1015.0, "version": None, "eval_acc": None,
             "eval_version": None, "progress": []}]
    assert store.learners() == want
    credited = {"L1": (32, 1), "L2": (4, 1)}  # what each credited in all, from how many peers
    latest = [{**{k: v for k, v in x.items() if k != "progress"},
               "rollouts": credited[x["learner"]][0], "contributors": credited[x["learner"]][1]} for x in want]
    assert store.board()["learner_progress"] == latest
    assert store.history()["A"] == [(1000.0, 8), (1010.0, 16), (1030.0, 24), (1040.0, 32)]  # contributions too
    store.close()
    again = LeaderboardStore(tmp_path / "lb.db")
    assert again.learners() == want
    with LeaderboardServer(again, "demo", "127.0.0.1", 0) as server:
        got = json.loads(_get(server.url + "api/learners")[0])
        assert got == json.loads(json.dumps(want)), got  # tuples as JSON arrays
        assert json.loads(_get(server.url + "api/leaderboard")[0])["learner_progress"] == latest
        assert json.loads(_get(server.url + "api/history")[0])["A"][-1] == [1040.0, 32]


def test_learning_chart_and_summary_show_each_learners_progress_with_names_escaped(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    for seq, (v, acc, at) in enumerate([(0, 0.125, 0), (3, 0.125, 0), (6, 0.5, 6), (9, 0.5, 6), (12, 0.625, 12)], 1):
        store.ingest(progress(tally("L1", seq, {"A": (8 * seq, 40 * seq)}, t=1000.0 + 60 * seq), v, acc, at))
    store.set_name("L1", '<script>alert(1)</script>')
    chart = render_learning_chart(store.learners())
    assert chart.startswith("<svg") and "<script>" not in chart and "&lt;script&gt;" in chart
    assert chart.count("<circle") == 3  # one dot per eval (versions 0, 6, 12), not per tally
    assert chart.count("<polyline") == 2  # the accuracy line and the version line
    assert "eval accuracy 62.5% at version 12" in chart and "version 12" in chart
    assert "no learner has reported" in render_learning_chart([])
    assert "no learner has reported" in render_learning_chart([{**store.learners()[0], "progress": []}])
    summary = render_rows(store.board())
    assert ('Learner &lt;script&gt;alert(1)&lt;/script&gt;: version 12, eval accuracy 62.5% at version 12.'
            in summary), summary


def test_a_history_only_page_says_it_shows_stored_history_and_a_live_one_that_it_refreshes(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(progress(tally("L1", 1, {"A": (8, 40)}), 3, 0.5, 2))
    live, stored = render_page(store.board(), "demo"), render_page(store.board(), "demo", live=False)
    assert "Live: updated every 5 s while this page is open." in live and 'data-refresh-ms="5000"' in live
    assert HISTORY_ONLY in stored and 'data-refresh-ms="0"' in stored
    assert "updated every" not in stored.lower()
    for page in (live, stored):
        assert '<img id="learning" src="learning.svg"' in page and '<img id="chart" src="chart.svg"' in page
    # and the service picks the mode from whether it has a swarm to follow
    for source, want in ((None, HISTORY_ONLY), (_FakeSwarm(), "Live: updated every")):
        with _served(store, source) as url:
            page = _get(url)[0]
            assert want in page, f"{source!r}: {page}"
            chart = _get(url + "learning.svg")[0]  # one tally: the eval's dot and the version's square
            assert chart.count("<circle") == 1 and chart.count('<rect x="') == 1, chart


@contextlib.contextmanager
def _served(store: LeaderboardStore, source=None):
    """`serve` in a thread (history only when `source` is None); yields the page's URL."""
    stop, urls = threading.Event(), []
    t = threading.Thread(target=serve, args=(store, "demo", "127.0.0.1", 0, stop),
                         kwargs={"source": source, "poll_s": 0.05, "ready": urls.append}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not urls and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        assert urls, "the service never became ready"
        yield urls[0]
    finally:
        stop.set()
        t.join(timeout=5)


# ---- real DHT peers ------------------------------------------------------------------------------------

@pytest.mark.integration
def test_the_dht_keeps_a_learners_tally_and_refuses_forged_ones(tmp_path):
    from swarm.p2p import SwarmNode

    nodes = []
    try:
        learner = SwarmNode(Identity.load_or_create(tmp_path / "l.key"), NetworkConfig(), "lbt")
        nodes.append(learner)
        forger = SwarmNode(Identity.load_or_create(tmp_path / "f.key"), NetworkConfig(initial_peers=learner.maddrs()), "lbt")
        reader = SwarmNode(Identity.load_or_create(tmp_path / "r.key"), NetworkConfig(initial_peers=learner.maddrs()), "lbt")
        nodes += [forger, reader]
        t = Tally()
        t.credit("sampler-A", 8, 40, "m")
        assert learner.publish_tally(t.record(learner.peer_id, "m"))
        forged = Tally()
        forged.credit(forger.peer_id, 10_000, 10_000, "m")
        assert not forger.publish_tally(forged.record(learner.peer_id, "m"))  # claims to be the learner
        got = reader.tally_of(learner.peer_id)
        assert got["learner"] == learner.peer_id and got["peers"]["sampler-A"]["rollouts"] == 8
    finally:
        for n in reversed(nodes):
            n.shutdown()


# ---- the service with a real swarm and a real browser ---------------------------------------------------

def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _chromium():
    """Debian's headless Chromium through selenium (skips, or fails in CI, where it is missing)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, chromedriver = require_chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(chromedriver), options=opts)


def _browser_check(url: str, shot: Path) -> str:
    """Load the page in headless Chromium; return the name cell's text; save a screenshot."""
    from selenium.webdriver.common.by import By

    driver = _chromium()
    try:
        driver.set_page_load_timeout(30)
        driver.get(url)
        assert "hetero-node leaderboard" in driver.title
        assert driver.execute_script("return window.__pwned === undefined")  # the name's script never ran
        rows = driver.find_elements(By.CSS_SELECTOR, "#board tbody tr")
        assert rows, "no rows on the page"
        driver.execute_script("document.querySelector('#board tbody').dataset.firstLoad = '1'")
        time.sleep(6)  # one client-side refresh (every 5 s) swaps in the server's rows (GET /rows)
        assert not driver.find_elements(By.CSS_SELECTOR, "#board tbody[data-first-load]"), "the page never refreshed"
        assert driver.execute_script("return window.__pwned === undefined")  # nor after the refresh
        rows = driver.find_elements(By.CSS_SELECTOR, "#board tbody tr")
        cells = rows[0].find_elements(By.TAG_NAME, "td")
        assert int(cells[3].text) > 0
        charts = driver.find_elements(By.CSS_SELECTOR, "#chart, #learning")
        assert len(charts) == 2
        for chart in charts:
            assert driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", chart)
        assert driver.find_element(By.ID, "mode").text.startswith("Live: updated every")
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        return cells[2].text
    finally:
        driver.quit()


@pytest.mark.integration
def test_swarm_tallies_reach_the_page_in_a_real_browser_and_survive_a_restart(tmp_path):
    from cli.procs import stop, wait_for_file
    from helpers.swarmkit import Swarm, peer_of, start_bootstrap

    require_chromium()  # skip before starting a swarm, not after
    name = '[red]<img src=x onerror="window.__pwned=1">bob'  # HTML for the page, rich markup for `status`
    s = Swarm(tmp_path)
    db = tmp_path / "lb" / "leaderboard.db"
    try:
        start_bootstrap(s)
        (s.base / "learner.toml").write_text("tally_every_s = 2.0\n[learner]\neval_every = 0\ngroups_per_step = 4\n")
        s.join("learner", "learner", "--config", str(s.base / "learner.toml"))
        s.join("sampler", "sampler", "--name", name)
        lb = s.start("leaderboard", ["leaderboard", "--serve", "127.0.0.1:0", "--initial-peers", s.addr,
                                     "--db", str(db), "--poll", "1", "--url-file", str(tmp_path / "lb.url")])
        url = wait_for_file(tmp_path / "lb.url", 90, lb).decode().strip()
        me = peer_of(s, "sampler")
        deadline, board = time.monotonic() + 240, {}
        while time.monotonic() < deadline:
            board = _get_json(url + "api/leaderboard")
            if board["peers"] and board["peers"][0]["rollouts"] >= 32 and board["peers"][0]["name"]:
                break
            time.sleep(1)
        top = board["peers"][0]
        assert top["peer_id"] == me and top["name"] == name and top["share"] == 1.0
        assert top["models"] == ["builtin:tiny-arith"] and top["tokens"] > top["rollouts"]
        assert peer_of(s, "learner") not in {p["peer_id"] for p in board["peers"]}  # learners are not credited
        # the learner's tally says how it is doing: its version, and its first eval (run at version 0)
        [learner] = _get_json(url + "api/learners")
        assert learner["learner"] == peer_of(s, "learner") and learner["version"] >= 0, learner
        assert 0.0 <= learner["eval_acc"] <= 1.0 and learner["eval_version"] == 0, learner
        versions = [v for _, v, _, _ in learner["progress"]]
        assert versions == sorted(versions) and all(p[2:] == [learner["eval_acc"], 0] for p in learner["progress"]), learner
        shown = _browser_check(url, ARTIFACTS / "leaderboard.png")
        assert shown == name  # shown as text, not run as HTML
        table = subprocess.run([sys.executable, "-m", "cli.main", "status", "--initial-peers", s.addr],
                               capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
        # and not taken as rich markup by `status`: all of it, wrapped over lines of its column
        lines = table.stdout.splitlines()
        header = next(line for line in lines if line.startswith("peer"))
        start, end = header.index("name"), header.index("role")
        cells = "".join(line[start:end] for line in lines[lines.index(header) + 2:])
        assert "".join(name.split()) in "".join(cells.split()), table.stdout
        stop([s.nodes.pop("leaderboard")])
        # restart without the swarm: the history is still there
        lb = s.start("leaderboard-again", ["leaderboard", "--serve", "127.0.0.1:0", "--db", str(db),
                                           "--url-file", str(tmp_path / "lb2.url")])
        url2 = wait_for_file(tmp_path / "lb2.url", 60, lb).decode().strip()
        again = _get_json(url2 + "api/leaderboard")["peers"][0]
        assert again["peer_id"] == me and again["rollouts"] >= top["rollouts"]
        assert len(_get_json(url2 + "api/history")[me]) >= 1
        assert _get_json(url2 + "api/learners")[0]["progress"][: len(learner["progress"])] == learner["progress"]
        assert HISTORY_ONLY in _get(url2)[0]  # and it says it is not following the swarm
    finally:
        s.stop_all()


def _fill(store: LeaderboardStore) -> None:
    """Half an hour of a small swarm: one learner evaluating every 10 versions, five samplers, one
    with a 64-character name without spaces and one with markup for a name."""
    samplers = ["12D3KooW" + hashlib.sha256(bytes([i])).hexdigest()[:44] for i in range(5)]  # peer-id-like
    names = ["alice", "bob's laptop (RTX 4090)", "x" * 64, '<img src=x onerror="window.__pwned=1">carol', "dave"]
    for peer, name in zip(samplers, names):
        store.set_name(peer, name)
    store.set_name("12D3KooWLearnerEU", "learner-eu")
    t0 = 1_700_000_000.0
    for step in range(31):
        version = 2 * step
        credit = {p: (4 * (step - 3 * i + 1) * (i + 1), 40 * (step - 3 * i + 1) * (i + 1))
                  for i, p in enumerate(samplers) if step >= 3 * i}
        last_eval = version - version % 10
        acc = 0.125 + 0.5 * last_eval / 60
        store.ingest(progress(tally("12D3KooWLearnerEU", step + 1, credit, t=t0 + 60 * step), version, acc, last_eval))


def _page_facts(driver, url: str, width: int, height: int, phone: bool, shot: Path) -> dict:
    """Open `url` at width x height (as a phone: mobile viewport), wait for both charts, save a
    full-page screenshot; what the page looks like, measured in the browser."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 2 if phone else 1, "mobile": phone})
    driver.get(url)
    loaded = "return ['chart', 'learning'].every(id => document.getElementById(id).complete)"
    deadline = time.monotonic() + 20
    while not driver.execute_script(loaded) and time.monotonic() < deadline:
        time.sleep(0.1)
    facts = driver.execute_script("""
        const img = id => { const e = document.getElementById(id), r = e.getBoundingClientRect();
                            return {natural: e.naturalWidth, width: r.width, height: r.height, right: r.right}; };
        return {scroll: document.documentElement.scrollWidth, inner: window.innerWidth,
                learning: img("learning"), chart: img("chart"), mode: document.getElementById("mode").textContent,
                rows: document.querySelectorAll("#board tbody tr").length, pwned: window.__pwned !== undefined};""")
    facts["svgs"] = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        Promise.all(["learning.svg", "chart.svg"].map(u => fetch(u).then(r => r.text()))).then(done);""")
    png = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.write_bytes(base64.b64decode(png["data"]))
    return facts


@pytest.mark.integration
def test_the_stored_history_page_reads_at_phone_and_desktop_widths_in_a_real_browser(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    _fill(store)
    with _served(store) as url:  # no swarm: the history-only mode
        driver = _chromium()
        try:
            for label, (w, h, phone) in {"phone": (390, 844, True), "desktop": (1280, 800, False)}.items():
                f = _page_facts(driver, url, w, h, phone, ARTIFACTS / f"leaderboard-{label}.png")
                assert f["inner"] == w and f["scroll"] <= f["inner"], f"{label}: the page scrolls sideways: {f}"
                for chart in ("learning", "chart"):
                    c = f[chart]
                    assert c["natural"] > 0 and c["height"] > 100 and c["right"] <= w, f"{label} {chart}: {c}"
                learning, contributions = f["svgs"]
                assert learning.count("<circle") == 7 and "learner-eu: eval accuracy 62.5% at version 60" in learning
                assert contributions.count("<polyline") == 5 and "alice" in contributions
                assert f["mode"] == HISTORY_ONLY and f["rows"] == 5 and not f["pwned"], f"{label}: {f}"
            # side by side on a desktop, one above the other on a phone
            assert f["learning"]["right"] < f["chart"]["right"]
        finally:
            driver.quit()


def test_validators_refuse_a_peer_record_naming_another_peer_and_a_second_subkey_of_one_key(tmp_path):
    honest, attacker = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("h", "a"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))

    def info(peer_id: str, name: str) -> dict:
        return {"peer_id": peer_id, "role": "sampler", "model_id": "m", "version": 0, "engine": "hf", "throughput": 0.0,
                "software": "x", "protocol": 2, "maddrs": [], "learner": "", "name": name, "updated": 0.0, "private": False,
                "accepts": []}

    assert reader.validate(_record(attacker, attacker, info(attacker.peer_id, "me"), "hetero_t_peers"))
    # under its own key, naming the honest peer (to put its name on the honest peer's leaderboard row)
    assert not reader.validate(_record(attacker, attacker, info(honest.peer_id, "evil"), "hetero_t_peers"))
    # a second subkey of the same key (sybil peer records): only exactly [owner:<key>] is accepted
    assert not reader.validate(_record(attacker, attacker, info(attacker.peer_id, "me"), "hetero_t_peers", b"2"))
    # a swarm record names its coordinator, and only the signer can be it
    rec = {"coordinator": attacker.peer_id, "learners": [attacker.peer_id], "model_id": "", "models": {}, "updated": 0.0}
    assert reader.validate(_record(attacker, attacker, rec, own_key("t", "swarm", attacker.peer_id)))
    assert not reader.validate(_record(attacker, attacker, {**rec, "coordinator": honest.peer_id},
                                       own_key("t", "swarm", attacker.peer_id)))


def _info(peer_id: str, maddrs: list[str] | None = None) -> dict:
    return {"peer_id": peer_id, "role": "sampler", "model_id": "m", "version": 0, "engine": "hf", "throughput": 0.0,
            "software": "x", "protocol": 5, "maddrs": maddrs or [], "learner": "", "name": "", "updated": 0.0,
            "private": False, "accepts": []}


def test_an_owners_own_key_takes_its_record_and_nobody_elses(tmp_path):
    """Readers who know whom they want read that owner's own key (issue 39): it must hold the
    owner's one record, whatever other keys try to put there."""
    honest, attacker = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("h", "a"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    mine = own_key("t", "peer", honest.peer_id)
    assert reader.validate(_record(honest, honest, _info(honest.peer_id), mine))
    held = {"peer_id": honest.peer_id, "chain": "c", "versions": [1, 2]}
    assert reader.validate(_record(honest, honest, held, own_key("t", "holds", honest.peer_id)))
    t = Tally()
    t.credit("sampler-A", 8, 40, "m")
    assert reader.validate(_record(honest, honest, t.record(honest.peer_id, "m"), own_key("t", "tally", honest.peer_id)))
    # another key's record at the honest peer's own key: refused by every DHT peer, so stored nowhere
    assert not reader.validate(_record(attacker, attacker, _info(attacker.peer_id), mine))
    # a holder record where a peer record belongs (the kind is the key's), and a field missing
    assert not reader.validate(_record(honest, honest, held, mine))
    assert not reader.validate(_record(honest, honest, {k: v for k, v in _info(honest.peer_id).items() if k != "name"}, mine))
    # any other key: the swarm's DHT is not free storage
    assert not reader.validate(_record(attacker, attacker, _info(attacker.peer_id), "hetero_t_anything"))
    assert not reader.validate(_record(attacker, attacker, _info(attacker.peer_id), "hetero_t_holders"))


def test_one_key_has_one_subkey_not_one_per_comment_after_its_public_key(tmp_path):
    """The OpenSSH parser ignores a comment after the key, and hivemind's signature check accepts
    it: `...AAAA 1]`, `...AAAA 2]` were as many rows of one key, and a 500 KB comment passed the
    value's size bound. Only the key's canonical form is an owner."""
    peer = Identity.load_or_create(tmp_path / "p.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    own = RSASignatureValidator(peer.dht_private_key()).local_public_key
    for key in ("hetero_t_peers", own_key("t", "peer", peer.peer_id)):
        for subkey in (own[:-1] + b" 1]", own[:-1] + b" " + b"x" * 5000 + b"]"):
            record = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                               MSGPackSerializer.dumps(_info(peer.peer_id)), get_dht_time() + 60)
            signature = peer.dht_private_key().sign(MSGPackSerializer.dumps(dataclasses.astuple(record)))
            signed = dataclasses.replace(record, value=record.value + b"[signature:" + signature + b"]")
            assert not reader.validate(signed), (key, len(subkey))
        assert reader.validate(_record(peer, peer, _info(peer.peer_id), key))


def test_a_record_larger_or_longer_lived_than_its_kind_allows_is_refused(tmp_path):
    """Before: one key stored a 2.5 MB peer record (16 addresses of 200 characters is ~3.5 KB)."""
    peer = Identity.load_or_create(tmp_path / "p.key")
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))
    fits = _info(peer.peer_id, ["/ip4/1.2.3.4/tcp/1/" + "x" * 180] * 16)
    assert reader.validate(_record(peer, peer, fits, "hetero_t_peers"))
    assert reader.validate(_record(peer, peer, fits, own_key("t", "peer", peer.peer_id)))
    big = _info(peer.peer_id, ["/ip4/1.2.3.4/tcp/1/" + "x" * 980] * 5)
    assert not reader.validate(_record(peer, peer, big, "hetero_t_peers"))
    assert not reader.validate(_record(peer, peer, big, own_key("t", "peer", peer.peer_id)))
    assert reader.validate(_record(peer, peer, _info(peer.peer_id), "hetero_t_peers", ttl=MAX_TTL - 60))
    assert not reader.validate(_record(peer, peer, _info(peer.peer_id), "hetero_t_peers", ttl=MAX_TTL + 60))
