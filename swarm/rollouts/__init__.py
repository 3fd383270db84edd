"""Rollouts over the swarm: signed records from a sampler's outbox to the learner's journal.

    wire.py       hetero.rollouts.v2: the batch and `RolloutReply`, encoded and decoded in one place
    sender.py     the sampler's side: outbox -> one flusher thread per learner (`RolloutSender`)
    receiver.py   the learner's side: check, journal, acknowledge (`RolloutReceiver`), opened
                  on the learner's `Intake` (swarm/exchange.py)
    admission.py  what the door lets in: per-peer budgets, the unproven pool, the tarpit
    backlog.py    what each sampler holds at the learner not yet trained on (journal past the cursor)
"""

from swarm.rollouts.admission import MAX_OPEN_CALLS, Admission, Room, Standing, Tarpit, TokenBuckets, pool_bound
from swarm.rollouts.backlog import Backlog
from swarm.rollouts.receiver import RolloutReceiver
from swarm.rollouts.sender import RolloutSender
from swarm.wire.batch import MAX_BATCH, ROLLOUTS, BatchItem, RolloutReply, pack_batch, unpack_batch

__all__ = ["MAX_BATCH", "MAX_OPEN_CALLS", "ROLLOUTS", "Admission", "Backlog", "BatchItem", "Room",
           "RolloutReceiver", "RolloutReply", "RolloutSender", "Standing", "Tarpit", "TokenBuckets",
           "pack_batch", "pool_bound", "unpack_batch"]
