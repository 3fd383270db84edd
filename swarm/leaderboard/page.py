"""The leaderboard as HTML and SVG: pure functions of the store's board and history.

The table is rendered in one place only, `render_rows`, in Python, with every untrusted string
(display names, model ids, peer ids) passed through `html.escape`. The page's script never builds
cells itself: on each refresh it fetches that same fragment (GET /rows) and swaps it in, so the
first load and every refresh show exactly what one escaping function produced.

The script is a constant (its refresh period is read from the page), which lets the
Content-Security-Policy allow it by hash instead of allowing every inline script: if an
escaping bug ever let markup through, an injected `<script>` or `onerror=` still would not run.
"""

from __future__ import annotations

import base64
import hashlib
import html
import time
from typing import Any

from ..identity import short_id

# ---- the table ----------------------------------------------------------------------------------

_NUMERIC = {0, 3, 4, 5}  # rank, rollouts, tokens, share: right-aligned
_NAME = 2  # free text: allowed to wrap


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


def render_summary(board: dict[str, Any]) -> str:
    """One line under the title (plain text; escape it where it goes into HTML)."""
    return f"{len(board['peers'])} peer(s), {board['total_rollouts']} accepted rollouts, {board['learners']} learner(s)."


def _row(p: dict[str, Any]) -> str:
    cells = [p["rank"], short_id(p["peer_id"]), p["name"], p["rollouts"], p["tokens"], f"{100 * p['share']:.1f}%",
             _when(p["first_seen"]), _when(p["last_seen"]), ", ".join(p["models"])]
    tds = []
    for i, value in enumerate(cells):
        attrs = ' class="num"' if i in _NUMERIC else ' class="name"' if i == _NAME else ""
        if i == 1:
            attrs = f' title="{html.escape(p["peer_id"])}"'  # the full id, for copying
        tds.append(f"<td{attrs}>{html.escape(str(value))}</td>")
    return "<tr>" + "".join(tds) + "</tr>"


def render_rows(board: dict[str, Any]) -> str:
    """The table body, `<tbody data-summary="…">…</tbody>`: the page embeds it on first load and
    GET /rows serves it for every refresh. The summary rides along as an attribute so one request
    gives the script a consistent snapshot (rows and counts from the same board)."""
    rows = "".join(_row(p) for p in board["peers"])
    return f'<tbody data-summary="{html.escape(render_summary(board))}">{rows}</tbody>'


# ---- the chart ----------------------------------------------------------------------------------

_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]


def _label(peer: str, names: dict[str, str]) -> str:
    return names.get(peer) or short_id(peer)


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
    svg.append(f'<text x="{pad_l + plot_w}" y="{height - 8}" text-anchor="end">{(t1 - t0) / 60:.1f} min</text>'
               f'<text x="{pad_l}" y="{height - 8}">accepted rollouts over time</text>')
    for i, (peer, pts) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        path = [xy(t, v) for t, v in pts]
        if len(path) == 1:  # a single point draws nothing: start its line at zero
            path.insert(0, xy(t0, 0))
        svg.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                   f'points="{" ".join(f"{x},{y}" for x, y in path)}"/>')
        ly = pad_t + 14 * i + 8
        svg.append(f'<rect x="{width - pad_r + 10}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
                   f'<text x="{width - pad_r + 24}" y="{ly + 1}">{html.escape(_label(peer, names)[:20])}</text>')
    svg.append("</svg>")
    return "".join(svg)


# ---- the page -----------------------------------------------------------------------------------

# Swaps in the server-rendered rows; never builds cells from data (see the module docstring).
_SCRIPT = """
const board = document.getElementById("board");
async function refresh() {
  try {
    const r = await fetch("rows", {cache: "no-store"});
    if (!r.ok) throw new Error("GET rows: HTTP " + r.status);
    const t = document.createElement("template");  // inert: nothing in it loads or runs
    t.innerHTML = await r.text();  // escaped by the server (render_rows), as on the first load
    const body = t.content.querySelector("tbody");
    if (!body) throw new Error("GET rows: no <tbody>");
    board.tBodies[0].replaceWith(body);
    document.getElementById("summary").textContent = body.dataset.summary;
    document.getElementById("chart").src = "chart.svg?t=" + Date.now();
  } catch (e) { console.warn("leaderboard refresh failed", e); }
}
setInterval(refresh, Number(document.body.dataset.refreshMs));
"""

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()

# Scripts: only the one above (by hash), so no inline handler or injected script runs. Styles: the
# inline <style>. Everything else (fetch, the chart) from this origin only.
CONTENT_SECURITY_POLICY = (f"default-src 'self'; script-src 'sha256-{_SCRIPT_HASH}'; style-src 'unsafe-inline'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #111827; padding: 0 1rem; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; }
.sub { color: #6b7280; margin-top: 0; }
table { border-collapse: collapse; width: 100%; margin: 1rem 0; font-size: .9rem; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #e5e7eb; }
th { background: #f3f4f6; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td { white-space: nowrap; } td.name { white-space: normal; word-break: break-all; max-width: 16rem; }
"""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hetero-node leaderboard: {swarm}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{style}</style></head>
<body data-refresh-ms="{refresh_ms}">
<h1>hetero-node leaderboard &mdash; swarm <span id="swarm">{swarm}</span></h1>
<p class="sub">Rollouts that learners accepted and trained on, per contributing peer, from tallies the
learners sign. <span id="summary">{summary}</span></p>
<table id="board"><thead><tr><th>#</th><th>peer</th><th>name</th><th>accepted rollouts</th><th>tokens</th>
<th>share</th><th>first seen (UTC)</th><th>last seen (UTC)</th><th>models</th></tr></thead>
{rows}</table>
<img id="chart" src="chart.svg" alt="accepted rollouts over time" width="640" height="220">
<p class="sub">JSON: <a href="api/leaderboard">api/leaderboard</a>, <a href="api/history">api/history</a>.
Updated every {refresh_s} s while this page is open.</p>
<script>{script}</script>
</body></html>
"""


def render_page(board: dict[str, Any], swarm: str, refresh_s: float = 5.0) -> str:
    """The whole page; its script refreshes rows, summary and chart every `refresh_s` seconds."""
    refresh_ms = max(1000, round(refresh_s * 1000))  # a zero period would hammer the service
    return _PAGE.format(swarm=html.escape(swarm), style=_STYLE, summary=html.escape(render_summary(board)),
                        rows=render_rows(board), refresh_ms=refresh_ms, refresh_s=f"{refresh_ms / 1000:g}",
                        script=_SCRIPT)
