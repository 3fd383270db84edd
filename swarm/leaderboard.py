"""The public leaderboard: learners' signed tallies (tally.py), kept in SQLite, served over HTTP.

A coordinator runs `hetero-node leaderboard --serve HOST:PORT --initial-peers ADDR`. A collector
reads every learner's tally from the DHT (the DHT's validators have already refused forged,
edited and self-crediting tallies) and the samplers' display names from their PeerInfo; the store
keeps, per learner, only its newest tally (a lower sequence number is a replay and is refused and
counted) plus a history of every change, so the board survives restarts and DHT expiry.

HTTP (stdlib, read-only):
  /                  the page: rank, peer, name, rollouts, tokens, share, first/last seen, models,
                     and a chart of contributions over time; it refreshes itself while open
  /api/leaderboard   the same as JSON, plus how many tallies were accepted or refused, by reason
  /api/history       cumulative rollouts per peer over time, as JSON
  /chart.svg         the chart
Display names are untrusted: the page escapes them (server side) and sets them as text (client
side); the SVG escapes them too.
"""

from __future__ import annotations

import html
import json
import logging
import sqlite3
import threading
import time
import unicodedata
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

import pydantic.v1 as pydantic

from .tally import TallyModel

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS learners (learner TEXT PRIMARY KEY, seq INTEGER, time REAL, model_id TEXT);
CREATE TABLE IF NOT EXISTS credits (learner TEXT, peer TEXT, groups_ INTEGER, rollouts INTEGER, tokens INTEGER,
                                    first REAL, last REAL, models TEXT, PRIMARY KEY (learner, peer));
CREATE TABLE IF NOT EXISTS history (time REAL, learner TEXT, peer TEXT, rollouts INTEGER, tokens INTEGER);
CREATE TABLE IF NOT EXISTS names (peer TEXT PRIMARY KEY, name TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS counters (reason TEXT PRIMARY KEY, n INTEGER);
"""


def clean_name(name: str, limit: int = 64) -> str:
    """Untrusted display text: no control or format characters, at most `limit` characters.
    (HTML escaping happens where it is rendered.)"""
    return "".join(ch for ch in str(name) if unicodedata.category(ch)[0] != "C")[:limit].strip()


class LeaderboardStore:
    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._lock = threading.Lock()  # the collector writes while HTTP threads read
        with self._lock, self._db:
            self._db.executescript(_SCHEMA)

    def _count(self, reason: str) -> None:
        self._db.execute("INSERT INTO counters VALUES (?, 1) ON CONFLICT(reason) DO UPDATE SET n = n + 1", (reason,))

    def ingest(self, tally: dict[str, Any], trusted: set[str] | None = None) -> str:
        """Take one learner's tally; returns 'new', 'unchanged', or why it was refused
        ('invalid', 'self_credit', 'untrusted', 'replay'), which is also counted."""
        try:
            t = TallyModel.parse_obj(tally)
        except (pydantic.ValidationError, TypeError) as e:
            return self._refuse("invalid", f"malformed tally: {e}")
        if t.learner in t.peers:
            return self._refuse("self_credit", f"learner {t.learner[-8:]} credits itself")
        if trusted is not None and t.learner not in trusted:
            return self._refuse("untrusted", f"tally from {t.learner[-8:]}, not a trusted learner")
        with self._lock, self._db:
            row = self._db.execute("SELECT seq FROM learners WHERE learner = ?", (t.learner,)).fetchone()
            if row is not None and t.seq == row[0]:
                return "unchanged"
            if row is not None and t.seq < row[0]:
                self._count("replay")
                log.warning("refused a replayed tally from %s (seq %d, we have %d)", t.learner[-8:], t.seq, row[0])
                return "replay"
            before = {p: r for p, r in self._db.execute("SELECT peer, rollouts FROM credits WHERE learner = ?",
                                                         (t.learner,))}
            self._db.execute("INSERT OR REPLACE INTO learners VALUES (?, ?, ?, ?)", (t.learner, t.seq, t.time, t.model_id))
            self._db.execute("DELETE FROM credits WHERE learner = ?", (t.learner,))
            for peer, c in t.peers.items():
                self._db.execute("INSERT INTO credits VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 (t.learner, peer, c.groups, c.rollouts, c.tokens, c.first, c.last, json.dumps(c.models)))
                if before.get(peer) != c.rollouts:
                    self._db.execute("INSERT INTO history VALUES (?, ?, ?, ?, ?)",
                                     (t.time, t.learner, peer, c.rollouts, c.tokens))
            self._count("accepted")
        return "new"

    def _refuse(self, reason: str, why: str) -> str:
        log.warning("refused a tally: %s", why)
        with self._lock, self._db:
            self._count(reason)
        return reason

    def set_name(self, peer: str, name: str) -> None:
        name = clean_name(name)
        if not name:
            return
        with self._lock, self._db:
            row = self._db.execute("SELECT name FROM names WHERE peer = ?", (peer,)).fetchone()
            if row is None or row[0] != name:  # every poll sees every name: write only changes
                self._db.execute("INSERT OR REPLACE INTO names VALUES (?, ?, ?)", (peer, name, time.time()))

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT reason, n FROM counters"))

    def board(self) -> dict[str, Any]:
        """Per peer, summed over learners, ranked by accepted rollouts."""
        with self._lock:
            rows = self._db.execute("SELECT peer, groups_, rollouts, tokens, first, last, models FROM credits").fetchall()
            names = dict(self._db.execute("SELECT peer, name FROM names"))
            learners = self._db.execute("SELECT COUNT(*), MAX(time) FROM learners").fetchone()
        peers: dict[str, dict[str, Any]] = {}
        for peer, groups, rollouts, tokens, first, last, models in rows:
            p = peers.setdefault(peer, {"peer_id": peer, "name": names.get(peer, ""), "groups": 0, "rollouts": 0,
                                        "tokens": 0, "first_seen": first, "last_seen": last, "models": []})
            p["groups"] += groups
            p["rollouts"] += rollouts
            p["tokens"] += tokens
            p["first_seen"], p["last_seen"] = min(p["first_seen"], first), max(p["last_seen"], last)
            p["models"] = sorted(set(p["models"]) | set(json.loads(models)))
        total = sum(p["rollouts"] for p in peers.values())
        ranked = sorted(peers.values(), key=lambda p: (-p["rollouts"], p["peer_id"]))
        for i, p in enumerate(ranked, 1):
            p["rank"], p["share"] = i, (p["rollouts"] / total if total else 0.0)
        return {"peers": ranked, "total_rollouts": total, "learners": learners[0], "updated": learners[1]}

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

    def close(self) -> None:
        with self._lock:
            self._db.close()


# ---- rendering ----------------------------------------------------------------------------------

_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]


def _label(peer: str, names: dict[str, str]) -> str:
    return names.get(peer) or peer[-10:]


def render_chart(history: dict[str, list[tuple[float, int]]], names: dict[str, str], width: int = 640,
                 height: int = 220, top: int = 8) -> str:
    """An SVG line chart of cumulative accepted rollouts per peer (the `top` largest)."""
    pad_l, pad_r, pad_t, pad_b = 56, 150, 12, 28
    series = sorted(history.items(), key=lambda kv: -kv[1][-1][1])[:top]
    points = [pt for _, pts in series for pt in pts]
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    if not points:
        svg.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#6b7280">'
                   'no accepted rollouts yet</text></svg>')
        return "".join(svg)
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    ymax = max(v for _, v in points) or 1
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b

    def xy(t: float, v: float) -> tuple[float, float]:
        x = pad_l + (plot_w * (t - t0) / (t1 - t0) if t1 > t0 else plot_w)
        return round(x, 1), round(pad_t + plot_h * (1 - v / ymax), 1)

    svg.append(f'<line x1="{pad_l}" y1="{pad_t + plot_h}" x2="{pad_l + plot_w}" y2="{pad_t + plot_h}" stroke="#9ca3af"/>')
    svg.append(f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + plot_h}" stroke="#9ca3af"/>')
    svg.append(f'<text x="{pad_l - 6}" y="{pad_t + 8}" text-anchor="end">{ymax}</text>')
    svg.append(f'<text x="{pad_l - 6}" y="{pad_t + plot_h}" text-anchor="end">0</text>')
    span = t1 - t0
    svg.append(f'<text x="{pad_l + plot_w}" y="{height - 8}" text-anchor="end">'
               f'{span / 60:.1f} min</text><text x="{pad_l}" y="{height - 8}">accepted rollouts over time</text>')
    for i, (peer, pts) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        path = [xy(t, v) for t, v in pts]
        if len(path) == 1:
            path.insert(0, xy(t0, 0))
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                   f'points="{" ".join(f"{x},{y}" for x, y in path)}"/>')
        ly = pad_t + 14 * i + 8
        svg.append(f'<rect x="{width - pad_r + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{width - pad_r + 24}" y="{ly + 1}">{html.escape(_label(peer, names)[:20])}</text>')
    svg.append("</svg>")
    return "".join(svg)


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


def short_id(peer: str) -> str:
    return f"{peer[:6]}…{peer[-6:]}" if len(peer) > 14 else peer


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hetero-node leaderboard: {swarm}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #111827; padding: 0 1rem; }}
h1 {{ font-size: 1.4rem; margin-bottom: .2rem; }}
.sub {{ color: #6b7280; margin-top: 0; }}
table {{ border-collapse: collapse; width: 100%; margin: 1rem 0; font-size: .9rem; }}
th, td {{ text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #e5e7eb; }}
th {{ background: #f3f4f6; }} td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
td {{ white-space: nowrap; }} td.name {{ white-space: normal; word-break: break-all; max-width: 16rem; }}
code {{ font-size: .8rem; }}
</style></head>
<body>
<h1>hetero-node leaderboard &mdash; swarm <span id="swarm">{swarm}</span></h1>
<p class="sub">Rollouts that learners accepted and trained on, per contributing peer, from tallies the
learners sign. <span id="summary">{summary}</span></p>
<table id="board"><thead><tr><th>#</th><th>peer</th><th>name</th><th>accepted rollouts</th><th>tokens</th>
<th>share</th><th>first seen (UTC)</th><th>last seen (UTC)</th><th>models</th></tr></thead>
<tbody>{rows}</tbody></table>
<img id="chart" src="chart.svg" alt="accepted rollouts over time" width="640" height="220">
<p class="sub">JSON: <a href="api/leaderboard">api/leaderboard</a>, <a href="api/history">api/history</a>.
Updated every {refresh} s while this page is open.</p>
<script>
const cells = p => [p.rank, short(p.peer_id), p.name, p.rollouts, p.tokens, (100 * p.share).toFixed(1) + "%",
                    fmt(p.first_seen), fmt(p.last_seen), p.models.join(", ")];
function fmt(t) {{ return t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 16) : "-"; }}
const short = id => id.length > 14 ? id.slice(0, 6) + "…" + id.slice(-6) : id;
async function refresh() {{
  try {{
    const data = await (await fetch("api/leaderboard", {{cache: "no-store"}})).json();
    const body = document.createElement("tbody");
    for (const p of data.peers) {{
      const tr = body.insertRow();
      cells(p).forEach((v, i) => {{ const td = tr.insertCell(); td.textContent = String(v);  // never as HTML
                                     if ([0, 3, 4, 5].includes(i)) td.className = "num";
                                     if (i === 2) td.className = "name";
                                     if (i === 1) td.title = p.peer_id; }});
    }}
    document.querySelector("#board tbody").replaceWith(body);
    document.getElementById("summary").textContent = summary(data);
    document.getElementById("chart").src = "chart.svg?t=" + Date.now();
  }} catch (e) {{ console.warn("leaderboard refresh failed", e); }}
}}
function summary(d) {{ return `${{d.peers.length}} peer(s), ${{d.total_rollouts}} accepted rollouts, ${{d.learners}} learner(s).`; }}
setInterval(refresh, {refresh} * 1000);
</script>
</body></html>
"""


def render_page(board: dict[str, Any], swarm: str, refresh_s: float = 5.0) -> str:
    css = {0: ' class="num"', 2: ' class="name"', 3: ' class="num"', 4: ' class="num"', 5: ' class="num"'}
    rows = []
    for p in board["peers"]:
        cells = [p["rank"], short_id(p["peer_id"]), p["name"], p["rollouts"], p["tokens"], f"{100 * p['share']:.1f}%",
                 _when(p["first_seen"]), _when(p["last_seen"]), ", ".join(p["models"])]
        tds = [f'<td{css.get(i, "")}>{html.escape(str(c))}</td>' for i, c in enumerate(cells)]
        tds[1] = f'<td title="{html.escape(p["peer_id"])}">{html.escape(short_id(p["peer_id"]))}</td>'
        rows.append("<tr>" + "".join(tds) + "</tr>")
    summary = f"{len(board['peers'])} peer(s), {board['total_rollouts']} accepted rollouts, {board['learners']} learner(s)."
    return _PAGE.format(swarm=html.escape(swarm), rows="".join(rows), summary=html.escape(summary),
                        refresh=int(refresh_s))


# ---- service ------------------------------------------------------------------------------------

def make_server(store: LeaderboardStore, swarm: str, host: str, port: int, refresh_s: float = 5.0) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) for `store`; port 0 picks a free one (`server.server_address`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlparse(self.path).path
            try:
                if path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", render_page(store.board(), swarm, refresh_s))
                elif path == "/api/leaderboard":
                    self._send(200, "application/json", json.dumps({"swarm": swarm, **store.board(),
                                                                    "tallies": store.counters()}))
                elif path == "/api/history":
                    self._send(200, "application/json", json.dumps(store.history()))
                elif path == "/chart.svg":
                    names = {p["peer_id"]: p["name"] for p in store.board()["peers"]}
                    self._send(200, "image/svg+xml", render_chart(store.history(), names))
                else:
                    self._send(404, "text/plain", "not found")
            except Exception as e:  # one bad request must not take the service down
                log.exception("leaderboard request %s failed", path)
                self._send(500, "text/plain", f"internal error: {type(e).__name__}")

        def _send(self, code: int, ctype: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline' 'self'; "
                             "style-src 'unsafe-inline'")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args) -> None:
            log.debug("http: " + fmt, *args)

    return ThreadingHTTPServer((host, port), Handler)


def collect_once(store: LeaderboardStore, tallies: Callable[[], list[dict]], peers: Callable[[], list[dict]],
                 trusted: set[str] | None = None) -> dict[str, int]:
    """One pass of the collector: every tally and every display name the DHT holds now."""
    outcome: dict[str, int] = {}
    for t in tallies():
        r = store.ingest(t, trusted)
        outcome[r] = outcome.get(r, 0) + 1
    for p in peers():
        if p.get("name"):
            store.set_name(p["peer_id"], p["name"])
    return outcome
