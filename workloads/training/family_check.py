"""The library entry point's check of a team's own model family (``run_training(...,
family=...)``), on the driver before anything is reserved: every member the worker loop reads,
not together with ``scale`` or ``train.model``, and its module registered with Ray's cloudpickle
to be pickled by value (a driver script's module is not on the workers' path). No jax here.
"""

from __future__ import annotations

import sys
from typing import Any

from raytpu.errors import invalid
from workloads.training.config import TrainConfig

FAMILY_MEMBERS = (
    "config", "flops_per_token", "init", "train_step", "mesh", "state_shardings",
    "batch_sharding", "batches", "to_dict",
)  # fmt: skip
"""What the worker loop reads of a family (the training half of ``ModelFamily``)."""


def check_family(family: Any, scale: Any, run: TrainConfig) -> None:
    """A user's family: every member the worker loop reads, not with ``scale`` or ``model``;
    its module registered to be pickled by value (a driver script's module is not on the
    workers' path)."""
    import ray.cloudpickle

    missing = [m for m in FAMILY_MEMBERS if not hasattr(family, m)]
    if missing:
        raise ValueError(
            invalid(
                "family",
                type(family).__name__,
                "an object with " + ", ".join(FAMILY_MEMBERS),
                reason="missing " + ", ".join(missing),
            )
        )
    for clash, value in (("scale", scale), ("train.model", run.model)):
        if value:
            raise ValueError(invalid(clash, value, "unset with family= (the family is the model)"))
    module = sys.modules.get(type(family).__module__)
    ours = ("workloads", "raytpu", "builtins")
    if module is not None and module.__name__.split(".")[0] not in ours:
        ray.cloudpickle.register_pickle_by_value(module)
