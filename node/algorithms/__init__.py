"""Policy losses (GRPO, Dr. GRPO, GRPO with a sequence drift mask, GSPO, GEPO and its length-clipped
preset `gepo_lenclip` (the learner's default), M2PO, truncated IS,
F-TIS, and `pg`: no correction), one small pure function each, chosen by name through `ALGORITHMS`.

    from node.algorithms import get_algorithm, LossInputs
    algo = get_algorithm("gepo")
    out = algo.loss(LossInputs(...), algo.config_cls(beta=0.005))

Every loss takes `LossInputs` and its own frozen config dataclass and returns `LossOutput`
(scalar loss + float diagnostics). `normalize_std` in each config says how its advantages are
computed (node.algorithms.advantages).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from node.algorithms.advantages import group_advantages, has_signal
from node.algorithms.base import AGGREGATIONS, LossInputs, LossOutput
from node.algorithms.ftis import FTISConfig, ftis_loss
from node.algorithms.gepo import GEPOConfig, GEPOLenClipConfig, gepo_loss
from node.algorithms.grpo import DrGRPOConfig, GRPOConfig, grpo_loss
from node.algorithms.grpo_seqmask import GRPOSeqMaskConfig, grpo_seqmask_loss
from node.algorithms.gspo import GSPOConfig, gspo_loss
from node.algorithms.m2po import M2POConfig, m2po_loss
from node.algorithms.pg import PGConfig, pg_loss
from node.algorithms.tis import TISConfig, tis_loss


@dataclass(frozen=True)
class Algorithm:
    name: str
    loss: Callable[[LossInputs, Any], LossOutput]
    config_cls: type

    def make_config(self, overrides: dict[str, Any] | None = None) -> Any:
        """Config from a dict (e.g. a TOML table); unknown keys are an error that names the valid ones."""
        overrides = dict(overrides or {})
        valid = {f.name for f in fields(self.config_cls)}
        unknown = set(overrides) - valid
        if unknown:
            raise ValueError(f"{self.name}: unknown option(s) {sorted(unknown)}; valid: {sorted(valid)}")
        cfg = self.config_cls(**overrides)
        if getattr(cfg, "aggregation", "seq_mean") not in AGGREGATIONS:
            raise ValueError(f"{self.name}: aggregation must be one of {AGGREGATIONS}")
        return cfg


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a for a in (
        Algorithm("grpo", grpo_loss, GRPOConfig),
        Algorithm("dr_grpo", grpo_loss, DrGRPOConfig),
        Algorithm("grpo_seqmask", grpo_seqmask_loss, GRPOSeqMaskConfig),
        Algorithm("gspo", gspo_loss, GSPOConfig),
        Algorithm("gepo", gepo_loss, GEPOConfig),
        Algorithm("gepo_lenclip", gepo_loss, GEPOLenClipConfig),
        Algorithm("m2po", m2po_loss, M2POConfig),
        Algorithm("tis", tis_loss, TISConfig),
        Algorithm("ftis", ftis_loss, FTISConfig),
        Algorithm("pg", pg_loss, PGConfig),
    )
}


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}") from None


__all__ = ["ALGORITHMS", "Algorithm", "LossInputs", "LossOutput", "get_algorithm", "group_advantages", "has_signal"]
