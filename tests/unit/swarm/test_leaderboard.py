"""The leaderboard: a SQLite history of the tallies learners sign, and the page that shows it.

Unit tests (fast): the store's rules (newest tally per learner, replays / self-credit / untrusted /
malformed refused and counted, history kept across a restart), escaping of untrusted names (once,
in the one place rows are rendered), the HTTP service (the refresh fragment is the first load's
rows; a port in use fails at once), and the learners' progress kept and charted. The validators
every DHT peer runs: tests/unit/swarm/test_dht_validators.py; the page in a real browser:
tests/integration/swarm/test_leaderboard_browser.py; the server's budgets:
tests/unit/swarm/test_leaderboard_server.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
import urllib.error

import pytest

from helpers.leaderboard import http_get, peer, progress, served, tally
from helpers.wait import PATIENCE_S, until
from swarm.identity import short_id
from swarm.leaderboard import (LeaderboardServer, LeaderboardStore, clean_name, collect_once, render_chart,
                               render_learning_chart, render_page, render_rows, serve)
from swarm.leaderboard.page import HISTORY_ONLY


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



def test_rows_route_serves_the_rows_of_the_first_render_and_the_csp_allows_only_the_pages_script(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 1, {"A": (8, 40), "B": (4, 12)}))
    store.set_name("A", "<b>alice</b>")
    with LeaderboardServer(store, "demo", "127.0.0.1", 0, refresh_s=5.0) as server:
        url = server.url
        page, headers = http_get(url)
        rows, _ = http_get(url + "rows")
        assert rows.startswith("<tbody") and rows.count("<tr>") == 2
        assert rows in page and rows == render_rows(store.board())
        csp = headers["Content-Security-Policy"]
        script = re.search(r"<script>(.*?)</script>", page, re.S).group(1)
        digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
        directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
        assert directives["script-src"] == f"'sha256-{digest}'"  # that script runs, no other inline one would
        assert "innerHTML" in script and "insertCell" not in script  # it swaps server rows in, never builds cells
        assert json.loads(http_get(url + "api/leaderboard")[0])["total_rollouts"] == 12
        assert http_get(url + "chart.svg")[0].startswith("<svg")
        with pytest.raises(urllib.error.HTTPError) as e:
            http_get(url + "nope")
        assert e.value.code == 404


class _FakeSwarm:
    """A source like SwarmNode: a coordinator naming L1, tallies and PeerInfos, without a DHT."""

    coordinators = {"C"}
    refreshed = 0

    def trusted_learners(self, coordinators: set[str]) -> dict[str, str]:
        return {"L1": ""} if coordinators == {"C"} else {}

    def refresh_directory(self, force: bool = False) -> None:
        self.refreshed += force  # each poll asks for newer records, at the poll's cadence

    def tally_of(self, learner: str) -> dict | None:
        return {"L1": tally("L1", 1, {"A": (8, 40)}), "L2": tally("L2", 1, {"A": (99, 99)})}.get(learner)

    def peer_records(self, peer_ids: list[str]) -> dict[str, dict]:
        return {p: r for p, r in {"A": peer("A", "alice")}.items() if p in peer_ids}


def test_serve_collects_from_its_source_until_stopped_and_frees_the_port(tmp_path):
    store, stop, urls, source = LeaderboardStore(tmp_path / "lb.db"), threading.Event(), [], _FakeSwarm()
    t = threading.Thread(target=serve, args=(store, "demo", "127.0.0.1", 0, stop),
                         kwargs={"source": source, "poll_s": 0.05, "ready": urls.append}, daemon=True)
    t.start()
    until(lambda: urls and store.board()["peers"], "the server up and a poll collected")
    board = json.loads(http_get(urls[0] + "api/leaderboard")[0])
    # 8 from L1, which the coordinator names; L2's tally (99 more) is never read
    assert [(p["peer_id"], p["name"], p["rollouts"]) for p in board["peers"]] == [("A", "alice", 8)]
    assert source.refreshed >= 1  # every poll asks for newer records, not only every 10 s
    stop.set()
    t.join(timeout=PATIENCE_S)
    assert not t.is_alive()
    port = int(urls[0].rsplit(":", 1)[1].strip("/"))
    with socket.create_server(("127.0.0.1", port)):  # released, so a restart can take it again
        pass
    assert store.board()["peers"]  # the store is the caller's: still open


def test_serve_on_a_port_in_use_raises_oserror_before_anything_starts(tmp_path):
    store, called = LeaderboardStore(tmp_path / "lb.db"), []
    with socket.create_server(("127.0.0.1", 0)) as taken:
        with pytest.raises(OSError):
            serve(store, "demo", "127.0.0.1", taken.getsockname()[1], threading.Event(), source=_FakeSwarm(),
                  ready=called.append)
    assert not called and not store.board()["peers"]  # refused before it served or collected anything


def test_collector_takes_tallies_and_display_names(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    out = collect_once(store, lambda: [tally("L1", 1, {"A": (8, 40)}), tally("L1", 0, {"A": (99, 9)})],
                       lambda: [peer("A", "alice"), peer("L1")])
    assert out == {"new": 1, "replay": 1}
    assert store.board()["peers"][0]["name"] == "alice"


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
        got = json.loads(http_get(server.url + "api/learners")[0])
        assert got == json.loads(json.dumps(want)), got  # tuples as JSON arrays
        assert json.loads(http_get(server.url + "api/leaderboard")[0])["learner_progress"] == latest
        assert json.loads(http_get(server.url + "api/history")[0])["A"][-1] == [1040.0, 32]


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
        with served(store, source) as url:
            page = http_get(url)[0]
            assert want in page, f"{source!r}: {page}"
            chart = http_get(url + "learning.svg")[0]  # one tally: the eval's dot and the version's square
            assert chart.count("<circle") == 1 and chart.count('<rect x="') == 1, chart


class _Crowd(_FakeSwarm):
    """L1's tally credits A and B; 5,000 fresh keys named themselves in the peers index. Says which
    peers' records the collector read, per poll."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []
        self.records = {f"fresh{i:04d}": peer(f"fresh{i:04d}", f"spam {i}") for i in range(5000)}
        self.records.update({p: peer(p, n) for p, n in (("A", "alice"), ("B", "bob"), ("L1", "one"))})

    def refresh_directory(self, force: bool = False) -> None:
        pass

    def tally_of(self, learner: str) -> dict | None:
        return tally("L1", 1, {"A": (8, 40), "B": (4, 4)}) if learner == "L1" else None

    def peer_records(self, peer_ids: list[str]) -> dict[str, dict]:
        self.asked.append(list(peer_ids))
        return {p: self.records[p] for p in peer_ids if p in self.records}

    def peers(self) -> list[dict]:  # the whole index: the collector must not read it
        raise AssertionError("the collector read the whole peers index")


def test_names_are_kept_only_for_credited_peers_and_learners_and_go_when_their_credit_does(tmp_path, monkeypatch):
    store = LeaderboardStore(tmp_path / "lb.db")
    crowd = _Crowd()
    # the whole index handed to the collector: 5,000 fresh keys' names, of which none is kept
    collect_once(store, lambda: [crowd.tally_of("L1")], lambda: list(crowd.records.values()))
    assert store.named() == {"A", "B", "L1"}
    assert dict(store._db.execute("SELECT peer, name FROM names")) == {"A": "alice", "B": "bob", "L1": "one"}
    assert not store.set_name("fresh0001", "spam") and store.board()["peers"][0]["name"] == "alice"
    # the service asks the DHT only for the wanted names, at most MAX_NAME_LOOKUPS a poll, in turn
    import swarm.leaderboard.service as service
    monkeypatch.setattr(service, "MAX_NAME_LOOKUPS", 2)
    fresh = LeaderboardStore(tmp_path / "fresh.db")
    for _ in range(3):
        service._collect(fresh, crowd, None)
    assert crowd.asked == [["A", "B"], ["L1", "A"], ["B", "L1"]], crowd.asked
    assert fresh._db.execute("SELECT COUNT(*) FROM names").fetchone()[0] == 3
    assert {p["peer_id"]: p["name"] for p in fresh.board()["peers"]} == {"A": "alice", "B": "bob"}
    # B's credit gone from L1's newest tally (revoked): its name goes too
    assert store.ingest(tally("L1", 2, {"A": (16, 80)})) == "new"
    assert dict(store._db.execute("SELECT peer, name FROM names")) == {"A": "alice", "L1": "one"}
