"""swarm: the networking layer of hetero-node. It knows bytes and records, never torch models.

    exchange.py   the seam with node/: SamplerLink, LearnerLink, WeightVersion, Received, Intake
    wire/         every record and message: a typed struct each, with its bounds (the bottom of swarm/)
    links.py      the seam on the real swarm: rollouts/ (outbox -> journal) and weights/ (manifest + chunks)
    memory.py     the seam in one process, on a virtual clock (the simulator's swarm)
    p2p/          a peer: hivemind's P2P, our RPCs and framing, every door's budget (doors.py), reachability
    dht/          the DHT: what its keys hold, the validators every peer runs, the process, the record API
    discovery.py  which learner a sampler follows, which it feeds, who its mates are
    rollouts/     signed rollouts from a sampler's outbox to the learner's journal, and the rollout gate
    weights/      weight versions: the learner's manifest, chunks served by every holder, the fetcher
    leaderboard/  the public board of learners' signed tallies
    identity.py   one RSA key per peer: libp2p id, DHT record owner and record signer
    buckets.py    token buckets (standard library only: node/ counts its own costs with them)
    delay.py      injected WAN delay; lifetime.py: helper processes end with the node

node/ imports only exchange.py and wire/ from here (docs/DESIGN.md, "Layout").
"""
