"""swarm: the networking layer of hetero-node (identity, DHT discovery, records, rollout and blob
exchange, injected delay). It knows bytes and records, never torch models: node/ hands it encoded
records and blobs and receives them back (DESIGN section 2). Built in the swarm issue; the RL
core does not depend on it.
"""
