"""The public leaderboard: learners' signed tallies (swarm/wire/tally.py), kept in SQLite, served over HTTP.

A coordinator runs `hetero-node leaderboard --serve HOST:PORT --initial-peers ADDR`. A collector
reads every learner's tally from the DHT (the DHT's validators have already refused forged,
edited and self-crediting tallies) and the display names of the peers they credit (and of the
learners) from their own PeerInfo records, at most 256 a poll (signed by the peer it names, so
nobody can rename someone else; a key nobody credited costs the board nothing); the store keeps, per learner, only its
newest tally (a lower sequence number is a replay and is refused and counted) plus a history of
every change, so the board survives restarts and DHT expiry.

HTTP (read-only; aiohttp, with a budget on every connection: `ServerLimits` in server.py):
  /                  the page: whether the swarm learns (a chart of each learner's eval accuracy and
                     version over time), who helped (a chart of accepted rollouts per peer over
                     time), and the table: rank, peer, name, rollouts, tokens, share, first/last
                     seen, models. It refreshes itself while open if the service follows a swarm;
                     without --initial-peers it serves the stored history and says so
  /rows              the table body alone, as the page shows it (what the page's refresh swaps in)
  /api/leaderboard   the table as JSON (`peers`; `others`: what tallies credit the peers they do
                     not name with, summed), each learner's latest version and eval
                     (`learner_progress`), and how many tallies were accepted or refused, by reason
  /api/history       contributions over time: {peer: [[time, cumulative accepted rollouts], ...]}
  /api/learners      learning over time: [{learner, name, model_id, updated, version, eval_acc,
                     eval_version, progress: [[time, version, eval_acc, eval_version], ...]}]; a point
                     per change; eval_acc and eval_version are null until the learner's first eval
  /learning.svg      the learning chart
  /chart.svg         the contributions chart
Times are Unix seconds from the learners' tallies. Versions and accuracies are each learner's own
signed claims (swarm/wire/tally.py). Display names are untrusted: they are escaped in the one place the
table is rendered (`render_rows`, server side) and in the SVGs, and the Content-Security-Policy
lets no script run but the page's own.

Modules: `store` (SQLite), `page` (pure rendering), `server` (the HTTP server and its budgets),
`service` (the server and the collector loop together).
"""

from swarm.leaderboard.page import render_chart, render_learning_chart, render_page, render_rows
from swarm.leaderboard.server import LeaderboardServer, ServerLimits
from swarm.leaderboard.service import collect_once, serve
from swarm.leaderboard.store import LeaderboardStore, clean_name

__all__ = ["LeaderboardStore", "clean_name", "render_page", "render_rows", "render_chart", "render_learning_chart",
           "LeaderboardServer", "ServerLimits", "collect_once", "serve"]
