"""The public leaderboard: learners' signed tallies (swarm/tally.py), kept in SQLite, served over HTTP.

A coordinator runs `hetero-node leaderboard --serve HOST:PORT --initial-peers ADDR`. A collector
reads every learner's tally from the DHT (the DHT's validators have already refused forged,
edited and self-crediting tallies) and the samplers' display names from their PeerInfo (signed by
the peer it names, so nobody can rename someone else); the store keeps, per learner, only its
newest tally (a lower sequence number is a replay and is refused and counted) plus a history of
every change, so the board survives restarts and DHT expiry.

HTTP (stdlib, read-only):
  /                  the page: rank, peer, name, rollouts, tokens, share, first/last seen, models,
                     and a chart of contributions over time; it refreshes itself while open
  /rows              the table body alone, as the page shows it (what the page's refresh swaps in)
  /api/leaderboard   the same as JSON, plus how many tallies were accepted or refused, by reason
  /api/history       cumulative rollouts per peer over time, as JSON
  /chart.svg         the chart
Display names are untrusted: they are escaped in the one place the table is rendered
(`render_rows`, server side) and in the SVG, and the Content-Security-Policy lets no script run
but the page's own.

Modules: `store` (SQLite), `page` (pure rendering), `service` (HTTP server and collector loop).
"""

from .page import render_chart, render_page, render_rows
from .service import collect_once, make_server, serve
from .store import LeaderboardStore, clean_name

__all__ = ["LeaderboardStore", "clean_name", "render_page", "render_rows", "render_chart", "make_server",
           "collect_once", "serve"]
