"""The seam (`exchange.py`) on the real hivemind swarm, one class per direction.

`SwarmLearnerLink` = rollouts in (`rollouts.RolloutReceiver`) + weights out
(`weights.WeightServer`); `SwarmSamplerLink` = rollouts out (`rollouts.RolloutSender`) +
weights in (`weights.WeightFetcher`). Both sides draw their injected delays from one seeded RNG.
"""

from __future__ import annotations

import random

from swarm.delay import DelayConfig
from swarm.discovery import Peers
from swarm.exchange import Intake, IntakeConfig, Received, WeightVersion
from swarm.rollouts.journal import Journal
from swarm.rollouts.outbox import Outbox
from swarm.p2p import SwarmNode
from swarm.rollouts import RolloutReceiver, RolloutSender
from swarm.weights import FetchConfig, WeightFetcher, WeightPrefetcher, WeightServer


class SwarmLearnerLink:
    """The learner's link. The learner reads rollouts through it and the receiver asks the learner
    about each one (`Intake`), so rollouts are taken only once `open_intake` names a ready learner."""

    def __init__(self, node: SwarmNode, journal: Journal, cfg: IntakeConfig) -> None:
        self.node = node
        self.rollouts = RolloutReceiver(node, journal, cfg)
        self.weights = WeightServer(node)

    def open_intake(self, intake: Intake, cursor: int) -> None:
        """Take rollouts for `intake`, which has read the journal up to `cursor` (its checkpoint's).
        The samplers it has proven draw on their own budgets at every door, never on the pools of
        unproven keys (swarm/p2p/doors.py): a crowd of fresh keys cannot slow them."""
        self.rollouts.open(intake, cursor)
        self.node.doors.set_proven(intake.is_proven)

    @property
    def cursor(self) -> int:
        """Journal records handed to the learner so far (it saves this in its checkpoints)."""
        return self.rollouts.cursor

    def receive_rollouts(self, max_records: int, timeout: float = 0.0) -> list[Received]:
        return self.rollouts.receive(max_records, timeout)

    def publish_weights(self, version: WeightVersion) -> None:
        self.weights.publish(version)


class SwarmSamplerLink:
    def __init__(self, node: SwarmNode, outbox: Outbox, peers: Peers,
                 weight_delay: DelayConfig = DelayConfig(), rollout_delay: DelayConfig = DelayConfig(),
                 seed: int = 0, rpc_timeout: float = 30.0, weight_poll_s: float = 1.0,
                 fetch: FetchConfig = FetchConfig(), max_partner_owed: int = 256, pause_at: int = 32) -> None:
        """`peers`: whom the sampler follows, feeds and shares downloads with, as discovery keeps it
        (swarm/discovery.py, `LearnerTracker`): read each time the sender or the fetcher acts.
        `pause_at`: the learner backlog at which the sampler stops generating (`max_learner_backlog`)."""
        rng = random.Random(seed)
        self.weights = WeightFetcher(node, lambda: peers.current, weight_delay, rng, rpc_timeout, lambda: peers.mates,
                                     cfg=fetch, seeding=lambda: peers.seeding)
        # versions download while the sampler generates; it applies them between batches
        self.prefetch = WeightPrefetcher(self.weights, weight_poll_s)
        self.rollouts = RolloutSender(node, outbox, lambda: peers.current, rollout_delay, rng, rpc_timeout,
                                      lambda: peers.partners, max_partner_owed, pause_at=pause_at,
                                      version_s=lambda: self.prefetch.pace.seconds)

    @property
    def learner_backlog(self) -> int:
        return self.rollouts.learner_backlog

    def send_rollouts(self, records: list[tuple[str, bytes]]) -> None:
        self.rollouts.send(records)

    def fetch_weights(self, have_chain: str, have_version: int) -> list[WeightVersion] | None:
        return self.prefetch.take(have_chain, have_version)

    def close(self) -> None:
        self.rollouts.close()
        self.prefetch.close()
