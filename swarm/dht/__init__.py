"""The swarm's DHT (hivemind's Kademlia): who is in the swarm, and the records that say so.

    schema.py      the swarm's keys, and the struct each kind of record decodes to (swarm/wire/peer.py,
                   swarm/wire/tally.py)
    validation.py  `OwnerValidator`: the rules every peer runs on the swarm's keys (a record is its
                   signer's own; sizes and lifetimes bounded)
    network.py     `NetworkConfig`: where a peer listens and whom it dials, the address checks
    process.py     the DHT process (hivemind's, with its p2pd), started with the validators
    records.py     the record API: announce, publish and read peer, holder, tally and swarm records
    storage.py     the node's DHT storage and cache, budgeted (pools per kind of owner, bounded pushes)
    sealed.py      a record carried outside the DHT (swarm/directory/): signed and checked as the DHT does

Each peer stores its records at keys of its own, `hetero_<swarm>_<kind>/<peer id>`, under a subkey
holding its own public key, so only it can write them (validation.py says what else is refused).
"""

from swarm.dht.network import (BadAddressError, NetworkConfig, SwarmConnectError, check_announce_maddr,
                               check_multiaddr, is_loopback, peer_id_of_maddr)
from swarm.dht.process import create_dht, swarm_validators
from swarm.dht.records import (DHT_TIMEOUT, MAX_HELD, MAX_OWNERS, Listed, announce, announce_holdings, holdings_of,
                               list_peers, named_by, own_entries, own_records, peer_records, publish_swarm_record,
                               publish_tally, swarm_record, tally_of, trusted_learners)
from swarm.dht.schema import KINDS, own_key, peers_key
from swarm.dht.validation import OwnerValidator

__all__ = ["BadAddressError", "DHT_TIMEOUT", "KINDS", "Listed", "MAX_HELD", "MAX_OWNERS", "NetworkConfig",
           "OwnerValidator", "SwarmConnectError", "announce", "announce_holdings", "check_announce_maddr",
           "check_multiaddr", "create_dht", "holdings_of", "is_loopback", "list_peers", "named_by", "own_entries", "own_key", "own_records",
           "peer_id_of_maddr", "peer_records", "peers_key", "publish_swarm_record", "publish_tally", "swarm_record", "swarm_validators",
           "tally_of", "trusted_learners"]
