"""Publishing versions: the learner's weights, as the view samplers run, out through its link when
the cadence (`[learner.weights]`, `publish_due`) allows, and into the auditor's archive."""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from swarm.exchange import LearnerLink, WeightVersion

from node.audit.archive import VersionArchive
from node.weights.codec import PublishConfig, Publisher, publish_due
from node.weights.blob import encode_version, in_blob, untie, version_nonce

log = logging.getLogger(__name__)


class Publishing:
    def __init__(self, cfg: PublishConfig, model: torch.nn.Module, model_id: str, chain: str,
                 archive: VersionArchive, link: LearnerLink | None) -> None:
        self.cfg, self.model, self.model_id, self.chain, self.archive, self.link = cfg, model, model_id, chain, archive, link
        self.publisher = Publisher(cfg, cfg.view_dtype(next(model.parameters()).device))
        self._last = (0, 0.0, 0)
        """(version, time.monotonic(), bytes) of the last version published: `publish_due`'s inputs."""

    @property
    def published(self) -> int:
        """The newest version published (0 before the first)."""
        return self.publisher.version or 0

    def maybe(self, version: int) -> dict[str, Any]:
        """Publish `version` if the cadence allows; its figures for the step's metrics."""
        last, at, nbytes = self._last
        if not publish_due(self.cfg, version - last, time.monotonic() - at, nbytes):
            return {}
        return self.publish(version)

    def publish(self, version: int) -> dict[str, Any]:
        """Encode the model's weights as `version` (a patch or a keyframe) and offer them."""
        if self.link is None:
            return {}
        t0 = time.perf_counter()
        weights, aliases = untie(self.model.state_dict())
        enc = self.publisher.publish(weights, version)
        blob = encode_version(enc, self.model_id, self.chain, aliases)
        # archived as views of the blob the link serves: one copy of a keyframe, not two
        self.archive.put(self.chain, version, in_blob(enc, blob), version_nonce(blob), view=self.publisher.published)
        self.link.publish_weights(WeightVersion(self.model_id, self.chain, version, enc.base, blob))
        self._last = (version, time.monotonic(), len(blob))
        # the whole of it (encode, archive, offering it to samplers), and when samplers could ask for it
        stats = {**enc.stats, "weights_publish_s": time.perf_counter() - t0, "weights_published_at": time.time()}
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in stats.items()}
