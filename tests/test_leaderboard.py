"""The leaderboard: tallies only learners can sign, a SQLite history, a page checked in a real browser.

Unit tests (fast): the store's rules (newest tally per learner, replays / self-credit / untrusted /
malformed refused and counted, history kept across a restart), escaping of untrusted names (once,
in the one place rows are rendered), the HTTP service (the refresh fragment is the first load's
rows; a port in use fails at once), and the DHT validator chain every peer runs (forged, edited,
self-crediting tallies refused).
Integration: real in-process DHT peers refuse forged tallies; a loopback swarm's tallies reach the
page, checked in headless Chromium (screenshot saved), and survive a restart of the service.
"""

from __future__ import annotations

import base64
import hashlib
import json
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

from external import require_chromium
from node.accounting import Tally
from swarm.dht import NetworkConfig, SwarmSchema
from swarm.identity import Identity, short_id
from swarm.leaderboard import (LeaderboardStore, clean_name, collect_once, make_server, render_chart, render_page,
                               render_rows, serve)
from swarm.ownership import OwnerValidator, owner_peer_id
from swarm.tally import tallies_key

ARTIFACTS = Path(os.environ.get("HETERO_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "runs" / "test-artifacts"))


def tally(learner: str, seq: int, peers: dict[str, tuple[int, int]], t: float = 1000.0) -> dict:
    return {"learner": learner, "seq": seq, "time": t, "model_id": "m",
            "peers": {p: {"groups": r // 4, "rollouts": r, "tokens": tok, "first": t - 10.0, "last": t, "models": ["m"]}
                      for p, (r, tok) in peers.items()}}


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
    assert "no accepted rollouts yet" in render_chart({}, {})


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
    assert 'data-summary="1 peer(s), 8 accepted rollouts, 1 learner(s)."' in rows
    assert rows in render_page(store.board(), swarm="demo")  # the page's first load is the same fragment
    plain = LeaderboardStore(tmp_path / "plain.db")
    plain.ingest(tally("L1", 1, {"A": (8, 40)}))
    plain.set_name("A", 'Tom & "Jerry"')
    assert '<td class="name">Tom &amp; &quot;Jerry&quot;</td>' in render_rows(plain.board())
    assert "&amp;amp;" not in render_page(plain.board(), swarm="demo")


def _serving(store: LeaderboardStore):
    server = make_server(store, "demo", "127.0.0.1", 0, refresh_s=5.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _get(url: str) -> tuple[str, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode(), dict(r.headers)


def test_rows_route_serves_the_rows_of_the_first_render_and_the_csp_allows_only_the_pages_script(tmp_path):
    store = LeaderboardStore(tmp_path / "lb.db")
    store.ingest(tally("L1", 1, {"A": (8, 40), "B": (4, 12)}))
    store.set_name("A", "<b>alice</b>")
    server, url = _serving(store)
    try:
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
    finally:
        server.shutdown()
        server.server_close()


class _FakeSwarm:
    """A source like SwarmNode: tallies and PeerInfos, without a DHT."""

    def tallies(self) -> list[dict]:
        return [tally("L1", 1, {"A": (8, 40)})]

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


def _record(signer: Identity, owner: Identity, value: dict, key: str = tallies_key("t"), prefix: bytes = b"") -> DHTRecord:
    subkey = prefix + RSASignatureValidator(owner.dht_private_key()).local_public_key
    record = DHTRecord(DHTID.generate(source=key).to_bytes(), MSGPackSerializer.dumps(subkey),
                       MSGPackSerializer.dumps(value), get_dht_time() + 60)
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
        got = reader.tallies()
        assert [x["learner"] for x in got] == [learner.peer_id]
        assert got[0]["peers"]["sampler-A"]["rollouts"] == 8
    finally:
        for n in reversed(nodes):
            n.shutdown()


# ---- the service with a real swarm and a real browser ---------------------------------------------------

def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _browser_check(url: str, shot: Path) -> str:
    """Load the page in headless Chromium; return the name cell's text; save a screenshot."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    browser, chromedriver = require_chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,800"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
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
        chart = driver.find_element(By.ID, "chart")
        assert driver.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", chart)
        shot.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(shot))
        return cells[2].text
    finally:
        driver.quit()


@pytest.mark.integration
def test_swarm_tallies_reach_the_page_in_a_real_browser_and_survive_a_restart(tmp_path):
    from cli.procs import stop, wait_for_file
    from swarmkit import Swarm, peer_of, start_bootstrap

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
        shown = _browser_check(url, ARTIFACTS / "leaderboard.png")
        assert shown == name  # shown as text, not run as HTML
        table = subprocess.run([sys.executable, "-m", "cli.main", "status", "--initial-peers", s.addr],
                               capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
        assert name in table.stdout  # and not taken as rich markup by `status`
        stop([s.nodes.pop("leaderboard")])
        # restart without the swarm: the history is still there
        lb = s.start("leaderboard-again", ["leaderboard", "--serve", "127.0.0.1:0", "--db", str(db),
                                           "--url-file", str(tmp_path / "lb2.url")])
        url2 = wait_for_file(tmp_path / "lb2.url", 60, lb).decode().strip()
        again = _get_json(url2 + "api/leaderboard")["peers"][0]
        assert again["peer_id"] == me and again["rollouts"] >= top["rollouts"]
        assert len(_get_json(url2 + "api/history")[me]) >= 1
    finally:
        s.stop_all()


def test_validators_refuse_a_peer_record_naming_another_peer_and_a_second_subkey_of_one_key(tmp_path):
    honest, attacker = (Identity.load_or_create(tmp_path / f"{n}.key") for n in ("h", "a"))
    reader = _chain(Identity.load_or_create(tmp_path / "r.key"))

    def info(peer_id: str, name: str) -> dict:
        return {"peer_id": peer_id, "role": "sampler", "model_id": "m", "version": 0, "engine": "hf", "throughput": 0.0,
                "software": "x", "protocol": 1, "maddrs": [], "learner": "", "name": name, "updated": 0.0}

    assert reader.validate(_record(attacker, attacker, info(attacker.peer_id, "me"), "hetero_t_peers"))
    # under its own key, naming the honest peer (to put its name on the honest peer's leaderboard row)
    assert not reader.validate(_record(attacker, attacker, info(honest.peer_id, "evil"), "hetero_t_peers"))
    # a second subkey of the same key (sybil peer records): only exactly [owner:<key>] is accepted
    assert not reader.validate(_record(attacker, attacker, info(attacker.peer_id, "me"), "hetero_t_peers", b"2"))
    # a swarm record names its coordinator, and only the signer can be it
    rec = {"coordinator": attacker.peer_id, "learners": [attacker.peer_id], "model_id": "", "updated": 0.0}
    assert reader.validate(_record(attacker, attacker, rec, "hetero_t_swarm"))
    assert not reader.validate(_record(attacker, attacker, {**rec, "coordinator": honest.peer_id}, "hetero_t_swarm"))
