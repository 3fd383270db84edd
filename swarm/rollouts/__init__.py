"""Rollouts over the swarm: signed records from a sampler's outbox to the learner's journal
(hetero.rollouts.v2's messages: swarm/wire/batch.py).

    sender.py     the sampler's side: outbox -> one flusher thread per learner (`RolloutSender`)
    receiver.py   the learner's side: check, journal, acknowledge (`RolloutReceiver`), opened
                  on the learner's `Intake` (swarm/exchange.py)
    admission.py  what the rollout gate lets in: its door's rates, the rooms a sampler may fill
    outbox.py     the sampler's persistent outbox (SQLite): what waits for an acknowledgement
    journal.py    the learner's receive journal: appended and fsynced before an ack
    backlog.py    what each sampler holds at the learner not yet trained on (journal past the cursor)
"""

from swarm.rollouts.admission import MAX_OPEN_CALLS, Admission, Room, Standing, pool_bound
from swarm.rollouts.backlog import Backlog
from swarm.rollouts.receiver import RolloutReceiver
from swarm.rollouts.sender import RolloutSender

__all__ = ["MAX_OPEN_CALLS", "Admission", "Backlog", "Room", "RolloutReceiver", "RolloutSender", "Standing", "pool_bound"]
