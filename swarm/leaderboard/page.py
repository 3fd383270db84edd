"""The leaderboard as HTML and SVG: pure functions of the store's board, history and learners.

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

from swarm.identity import short_id

# ---- the table ----------------------------------------------------------------------------------

_NUMERIC = {0, 3, 4, 5}  # rank, rollouts, tokens, share: right-aligned
_WRAP = {2, 9}  # free text (a name; credits by learner): allowed to wrap


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) if ts else "-"


def render_summary(board: dict[str, Any]) -> str:
    """One line under the title (plain text; escape it where it goes into HTML)."""
    out = f"{len(board['peers'])} peer(s), {board['total_rollouts']} credited rollouts, {board['learners']} learner(s)."
    others = board.get("others") or {}
    if others.get("count"):  # a tally names its most credited and latest peers, and sums the rest
        out += f" {others['rollouts']} of the rollouts are from {others['count']} more peer(s) the tallies do not name."
    several = len(board.get("learner_progress", [])) > 1
    for x in board.get("learner_progress", []):
        if x["version"] is None:
            continue  # its software predates these fields
        name = x["name"] or short_id(x["learner"])
        model = f" ({x['model_id']})" if several and x.get("model_id") else ""
        acc = "" if x["eval_acc"] is None else f", eval accuracy {100 * x['eval_acc']:.1f}% at version {x['eval_version']}"
        credit = f", {x['rollouts']} credited rollouts from {x['contributors']} peer(s)" if several and "rollouts" in x else ""
        out += f" Learner {name}{model}: version {x['version']}{acc}{credit}."
    return out


def _per_learner(p: dict[str, Any], learners: list[dict[str, Any]]) -> str:
    """'Qm1234: 120 · Qm5678: 40': a peer's credited rollouts by learner, in the board's learner order."""
    names = {x["learner"]: x["name"] or short_id(x["learner"]) for x in learners}
    by = p.get("by_learner", {})
    return " · ".join(f"{names.get(k) or short_id(k)}: {by[k]}" for k in sorted(by, key=lambda k: names.get(k) or k))


def _row(p: dict[str, Any], learners: list[dict[str, Any]]) -> str:
    cells = [p["rank"], short_id(p["peer_id"]), p["name"], p["rollouts"], p["tokens"], f"{100 * p['share']:.1f}%",
             _when(p["first_seen"]), _when(p["last_seen"]), ", ".join(p["models"]), _per_learner(p, learners)]
    tds = []
    for i, value in enumerate(cells):
        attrs = ' class="num"' if i in _NUMERIC else ' class="name"' if i in _WRAP else ""
        if i == 1:
            attrs = f' title="{html.escape(p["peer_id"])}"'  # the full id, for copying
        tds.append(f"<td{attrs}>{html.escape(str(value))}</td>")
    return "<tr>" + "".join(tds) + "</tr>"


def render_rows(board: dict[str, Any]) -> str:
    """The table body, `<tbody data-summary="…">…</tbody>`: the page embeds it on first load and
    GET /rows serves it for every refresh. The summary rides along as an attribute so one request
    gives the script a consistent snapshot (rows and counts from the same board)."""
    rows = "".join(_row(p, board.get("learner_progress", [])) for p in board["peers"])
    return f'<tbody data-summary="{html.escape(render_summary(board))}">{rows}</tbody>'


# ---- the charts ---------------------------------------------------------------------------------
# Small SVGs (420 wide) that the page scales to its column: one column on a phone (about 0.85x there,
# so 12 px text stays readable), two on a desktop.
# Legends go under the plot, not beside it, so a phone keeps the whole width for the lines.

_COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"]
_W, _PLOT_H, _PAD_T, _ROW = 420, 150, 22, 18


def _label(peer: str, names: dict[str, str]) -> str:
    return names.get(peer) or short_id(peer)


class _Frame:
    """Maps (time, fraction of the y range) into the plot area of one chart."""

    def __init__(self, times: list[float], pad_l: int, pad_r: int) -> None:
        self.t0, self.t1 = min(times), max(times)
        self.left, self.right = pad_l, _W - pad_r

    def x(self, t: float) -> float:  # a single instant sits at the right edge: "now"
        span = self.t1 - self.t0
        return round(self.left + ((self.right - self.left) * (t - self.t0) / span if span > 0 else self.right - self.left), 1)

    @staticmethod
    def y(frac: float) -> float:
        return round(_PAD_T + _PLOT_H * (1 - frac), 1)


def _clock(ts: float, span: float) -> str:
    return time.strftime("%H:%M" if span < 86400 else "%m-%d %H:%M", time.gmtime(ts))


def _duration(span: float) -> str:
    if span <= 0 or span >= 86400:  # one instant; or the dates already say it
        return ""
    return f" ({span:.0f} s)" if span < 120 else f" ({span / 60:.0f} min)" if span < 7200 else f" ({span / 3600:.1f} h)"


def _svg(height: int, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" '
            f'font-family="system-ui, sans-serif" font-size="12" fill="#374151"><rect width="{_W}" height="{height}" '
            f'fill="white"/>{"".join(body)}</svg>')


def _empty(text: str) -> str:
    h = _PAD_T + _PLOT_H + 24
    return _svg(h, [f'<text x="{_W / 2}" y="{h / 2}" text-anchor="middle" fill="#6b7280">{html.escape(text)}</text>'])


def _axes(f: _Frame, left: list[str], right: list[str], title_l: str, title_r: str = "") -> list[str]:
    """Grid lines at 0, 1/2 and 1 of the range, labelled left (and right), titles above, times below."""
    out = []
    for i, frac in enumerate((0.0, 0.5, 1.0)):
        y = f.y(frac)
        out.append(f'<line x1="{f.left}" y1="{y}" x2="{f.right}" y2="{y}" stroke="{"#9ca3af" if i == 0 else "#e5e7eb"}"/>')
        out.append(f'<text x="{f.left - 4}" y="{y + 4}" text-anchor="end">{html.escape(left[i])}</text>')
        if right:
            out.append(f'<text x="{f.right + 4}" y="{y + 4}" fill="#6b7280">{html.escape(right[i])}</text>')
    out.append(f'<text x="{f.left}" y="{_PAD_T - 8}" font-weight="600">{html.escape(title_l)}</text>')
    if title_r:
        out.append(f'<text x="{f.right}" y="{_PAD_T - 8}" text-anchor="end" fill="#6b7280">{html.escape(title_r)}</text>')
    span, base = f.t1 - f.t0, _PAD_T + _PLOT_H + 16
    out.append(f'<text x="{f.left}" y="{base}">{_clock(f.t0, span)}</text>')
    out.append(f'<text x="{f.right}" y="{base}" text-anchor="end">{_clock(f.t1, span)} UTC{_duration(span)}</text>')
    return out


def _legend(entries: list[tuple[str, bool, str]], cols: int) -> tuple[list[str], int]:
    """(color, dashed, text) entries in `cols` columns under the plot; returns the SVG and its height."""
    out, top, width = [], _PAD_T + _PLOT_H + 26, (_W - 16) // cols
    for i, (color, dashed, text) in enumerate(entries):
        x, y = 8 + width * (i % cols), top + _ROW * (i // cols)
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(f'<line x1="{x}" y1="{y + 8}" x2="{x + 18}" y2="{y + 8}" stroke="{color}" stroke-width="3"{dash}/>'
                   f'<text x="{x + 24}" y="{y + 12}">{html.escape(text)}</text>')
    rows = -(-len(entries) // cols)
    return out, top + _ROW * rows + 4


def _line(points: list[tuple[float, float]], color: str, dashed: bool = False) -> str:
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    return (f'<polyline fill="none" stroke="{color}" stroke-width="2"{dash} '
            f'points="{" ".join(f"{x},{y}" for x, y in points)}"/>')


def _dot(x: float, y: float, color: str) -> str:
    return f'<circle cx="{x}" cy="{y}" r="3.5" fill="{color}"/>'


def render_chart(history: dict[str, list[tuple[float, int]]], names: dict[str, str], top: int = 8) -> str:
    """Contributions: an SVG line chart of cumulative credited rollouts per peer (the `top` largest)."""
    series = sorted(history.items(), key=lambda kv: -kv[1][-1][1])[:top]
    points = [pt for _, pts in series for pt in pts]
    if not points:
        return _empty("no credited rollouts yet")
    f, ymax = _Frame([t for t, _ in points], 48, 16), max(v for _, v in points) or 1
    body = _axes(f, ["0", f"{ymax / 2:g}", str(ymax)], [], "credited rollouts, cumulative")
    legend = []
    for i, (peer, pts) in enumerate(series):
        color = _COLORS[i % len(_COLORS)]
        path = [(f.x(t), f.y(v / ymax)) for t, v in pts]
        if len(path) == 1:  # a single point draws nothing: start its line at zero
            path.insert(0, (f.x(f.t0), f.y(0)))
        body += [_line(path, color), _dot(*path[-1], color)]
        legend.append((color, False, f"{_label(peer, names)[:18]} ({pts[-1][1]})"))
    svg_legend, height = _legend(legend, cols=2)
    return _svg(height, body + svg_legend)


def _acc_steps(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(time, accuracy) as a step line: an accuracy holds until the next eval replaces it."""
    out: list[tuple[float, float]] = []
    for t, acc in pts:
        if out:
            out.append((t, out[-1][1]))
        out.append((t, acc))
    return out


def render_learning_chart(learners: list[dict[str, Any]], top: int = 4) -> str:
    """Learning: per learner (`LeaderboardStore.learners()`), its eval accuracy (solid, a dot per eval,
    left axis) and its model version (dashed, right axis) over time."""
    series = [x for x in learners if x.get("progress")][:top]
    times = [p[0] for x in series for p in x["progress"]]
    if not times:
        return _empty("no learner has reported its version or eval yet")
    f = _Frame(times, 48, 44)
    vmax = max(p[1] for x in series for p in x["progress"]) or 1
    body = _axes(f, ["0%", "50%", "100%"], ["0", f"{vmax / 2:g}", str(vmax)], "eval accuracy", "version (dashed)")
    legend = []
    for i, x in enumerate(series):
        color, name = _COLORS[i % len(_COLORS)], (x["name"] or short_id(x["learner"]))[:20]
        versions = [(f.x(t), f.y(v / vmax)) for t, v, _, _ in x["progress"]]
        body += [_line(versions, color, dashed=True)] if len(versions) > 1 else []
        body.append(f'<rect x="{versions[-1][0] - 3}" y="{versions[-1][1] - 3}" width="6" height="6" fill="{color}"/>')
        evals = [(t, acc, at) for t, _, acc, at in x["progress"] if acc is not None]
        if evals:
            if len(evals) > 1:  # a single point draws no line: its dot shows it
                body.append(_line([(f.x(t), f.y(a)) for t, a in _acc_steps([(t, a) for t, a, _ in evals])], color))
            body += [_dot(f.x(t), f.y(a), color) for j, (t, a, at) in enumerate(evals) if j == 0 or at != evals[j - 1][2]]
            _, acc, at = evals[-1]
            legend.append((color, False, f"{name}: eval accuracy {100 * acc:.1f}% at version {at}"))
        legend.append((color, True, f"{name}: version {x['version']}"))
    svg_legend, height = _legend(legend, cols=1)
    return _svg(height, body + svg_legend)


# ---- the page -----------------------------------------------------------------------------------

# Swaps in the server-rendered rows and reloads the charts; never builds cells from data (see the
# module docstring). A period of 0 (stored history only) means nothing changes: no refresh at all.
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
    for (const id of ["chart", "learning"]) {
      const img = document.getElementById(id);
      img.src = img.src.split("?")[0] + "?t=" + Date.now();
    }
  } catch (e) { console.warn("leaderboard refresh failed", e); }
}
const period = Number(document.body.dataset.refreshMs);
if (period > 0) setInterval(refresh, period);
"""

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()

# Scripts: only the one above (by hash), so no inline handler or injected script runs. Styles: the
# inline <style>. Everything else (fetch, the charts) from this origin only.
CONTENT_SECURITY_POLICY = (f"default-src 'self'; script-src 'sha256-{_SCRIPT_HASH}'; style-src 'unsafe-inline'; "
                           "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

# Narrow screens: the charts stack in one column and scale down; the wide table scrolls inside its
# own box, so the page itself never scrolls sideways.
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 72rem; color: #111827; padding: 0 1rem; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; overflow-wrap: anywhere; }
.sub { color: #6b7280; margin: .3rem 0; overflow-wrap: anywhere; }
.mode { display: inline-block; margin: .4rem 0; padding: .2rem .6rem; border-radius: .3rem; background: #f3f4f6;
        color: #374151; font-size: .9rem; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 24rem), 1fr)); gap: 1rem 2rem;
          margin: 1rem 0; }
figure { margin: 0; min-width: 0; }
figcaption { font-weight: 600; margin-bottom: .3rem; }
figure img { display: block; width: 100%; height: auto; border: 1px solid #e5e7eb; border-radius: .3rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1rem; font-size: .9rem; }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid #e5e7eb; }
th { background: #f3f4f6; white-space: nowrap; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td { white-space: nowrap; } td.name { white-space: normal; word-break: break-all; min-width: 6rem; max-width: 16rem; }
@media (max-width: 40rem) { body { margin: 1rem auto; } h1 { font-size: 1.2rem; } }
"""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hetero-node leaderboard: {swarm}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{style}</style></head>
<body data-refresh-ms="{refresh_ms}">
<h1>hetero-node leaderboard &mdash; swarm <span id="swarm">{swarm}</span></h1>
<p class="sub">Whether the swarm is learning (each learner's model version and held-out eval accuracy) and who
helped (credited rollouts: those learners accepted and trained on, per contributing peer), from tallies the learners sign.</p>
<p class="sub" id="summary">{summary}</p>
<p class="mode" id="mode">{mode}</p>
<div class="charts">
<figure><figcaption>Learning: eval accuracy and version</figcaption>
<img id="learning" src="learning.svg" width="420" alt="each learner's eval accuracy and model version over time"></figure>
<figure><figcaption>Contributions: credited rollouts per peer</figcaption>
<img id="chart" src="chart.svg" width="420" alt="credited rollouts per peer over time"></figure>
</div>
<div class="scroll"><table id="board"><thead><tr><th>#</th><th>peer</th><th>name</th><th>credited rollouts</th>
<th>tokens</th><th>share</th><th>first seen (UTC)</th><th>last seen (UTC)</th><th>models</th><th>by learner</th></tr></thead>
{rows}</table></div>
<p class="sub">JSON: <a href="api/leaderboard">api/leaderboard</a>, <a href="api/history">api/history</a>,
<a href="api/learners">api/learners</a>.</p>
<script>{script}</script>
</body></html>
"""

HISTORY_ONLY = "Stored history: this service is not connected to a swarm, so the page shows what it stored and does not update."


def render_page(board: dict[str, Any], swarm: str, refresh_s: float = 5.0, live: bool = True) -> str:
    """The whole page. `live`: the service follows a swarm and the script refreshes rows, summary and
    charts every `refresh_s` seconds; otherwise it serves stored history, and says so."""
    refresh_ms = max(1000, round(refresh_s * 1000)) if live else 0  # a zero period would hammer the service
    mode = f"Live: updated every {refresh_ms / 1000:g} s while this page is open." if live else HISTORY_ONLY
    return _PAGE.format(swarm=html.escape(swarm), style=_STYLE, summary=html.escape(render_summary(board)),
                        mode=html.escape(mode), rows=render_rows(board), refresh_ms=refresh_ms, script=_SCRIPT)
