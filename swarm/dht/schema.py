"""What the swarm's DHT keys hold: the struct each kind of record decodes to (swarm/wire), and the keys.

    hetero_<swarm>_peers              an index: every peer writes its own row (a `PeerInfo`)
    hetero_<swarm>_<kind>/<peer id>   a key of its owner's own: one record of `kind`

Every peer runs the same validators (swarm/dht/validation.py), so a record that does not decode
to its kind's struct is refused by the whole DHT.
"""

from __future__ import annotations

from msgspec import Struct

from swarm.wire.peer import Holder, PeerInfo, SwarmRecord
from swarm.wire.tally import Tally

KINDS: dict[str, type[Struct]] = {"peers": PeerInfo, "peer": PeerInfo, "holds": Holder, "tally": Tally,
                                  "swarm": SwarmRecord}
"""What a record under each of the swarm's keys must decode to, by the key's name."""
INDEXES = ("peers",)
"""Keys every peer writes its own row of (`hetero_<swarm>_<name>`): listings (status, the leaderboard's
display names)."""
OWN_KINDS = ("peer", "holds", "tally", "swarm")
"""Keys of one owner each (`hetero_<swarm>_<kind>/<peer id>`): what readers who know the owner read."""


def peers_key(swarm: str) -> str:
    return f"hetero_{swarm}_peers"


def own_key(swarm: str, kind: str, peer_id: str) -> str:
    """The key only `peer_id` may write, one record (`OWN_KINDS`): what a reader who knows whom it
    wants reads, one get per owner, however many records other keys stored."""
    return f"hetero_{swarm}_{kind}/{peer_id}"
