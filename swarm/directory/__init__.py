"""The records that decide who trains, passed directly between the peers that hold them, so that
they reach every node whatever the DHT does (docs/DESIGN.md, "Discovery").

    book.py       `Book`: the verified entries a node keeps (its coordinators' swarm records, the
                  named learners' peer records and tallies), `LastGood`: what it last read of the DHT
    directory.py  `Directory`: seals our own, serves what we hold (hetero.directory.v1), asks our
                  coordinators and learners for what is newer, offers a learner's own to its coordinators

The messages: swarm/wire/directory.py; how an entry is signed and checked: swarm/dht/sealed.py.
"""
