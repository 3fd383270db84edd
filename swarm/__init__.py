"""swarm: the networking layer of hetero-node. It knows bytes and records, never torch models.

    exchange.py        the seam with node/: SamplerLink, LearnerLink, WeightVersion
    records.py         wire records (msgpack), validated before anything else sees them
    memory.py          the seam in one process, on a virtual clock (the simulator's swarm)
    swarm_exchange.py  the seam on hivemind: rollouts/ (outbox -> journal) and
                       weights/ (signed manifest + hash-checked chunks from any holder)
    p2p/, dht.py       a peer: hivemind DHT (signed, validated, expiring records) + our RPCs
    identity.py        one RSA key per peer: libp2p id, DHT record owner and record signer
    envelope.py        signed envelopes; discovery.py which learner to follow
    journal.py, outbox.py  what survives a crash on each side; delay.py injected WAN delay
    tally.py           the DHT validator of learners' credit tallies; leaderboard/ the public board

node/ imports only exchange.py and records.py from here (docs/DESIGN.md, "Layout").
"""
