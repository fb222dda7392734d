"""What a training worker says to Ray and its peers: the run board's events, Ray Train reports,
its placement, and the collectives every host takes one decision by (rank 0's view, a spare
slice). Used by :class:`workloads.training.worker_loop.WorkerLoop`; jax and ray are imported
inside (they run in a worker only)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from workloads import storage
from workloads.training import goodput as gp
from workloads.training.config import WorkerPlacement


def post_event(
    board: Any, kind: str, step: int, host: str, action: str, detail: str = "", wait: bool = False
) -> None:
    """Post a goodput event; ``wait``: until the board has it (this host may be gone right after)."""
    import ray

    posted = board.event.remote(asdict(gp.GoodputEvent(kind, step, host, action, 0.0, detail)))
    if wait:
        ray.get(posted, timeout=10)


def from_rank0(flagged: int | None) -> int | None:
    """Rank 0's flagged host (a collective: every host calls it each step)."""
    import numpy as np
    from jax.experimental import multihost_utils

    value = np.asarray(-1 if flagged is None else flagged, np.int32)
    agreed = int(multihost_utils.broadcast_one_to_all(value))
    return None if agreed < 0 else agreed


def spare_slice(shape: Any, me: int) -> bool:
    """Whether a whole slice of ``shape`` is free besides the run's (rank 0 tries to reserve one;
    every host gets its answer)."""
    import numpy as np
    from jax.experimental import multihost_utils

    from workloads.slices.reservation import spare_slice_exists

    spare = spare_slice_exists(shape) if me == 0 else False
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(spare)))


def spare_check_bound_s() -> float:
    """The longest :func:`spare_slice` takes (with no spare slice, all of it): the hang watchdog
    allows this much around the check."""
    from workloads.slices.release import SETTLE_S
    from workloads.slices.reservation import SPARE_CHECK_TIMEOUT_S

    return SPARE_CHECK_TIMEOUT_S + SETTLE_S + 1.0


def announce(board: Any, fault: Any, host: str) -> None:
    """Tell the driver a fault fires (and wait for it: the process may die right after)."""
    import ray

    ray.get(board.fired.remote(str(fault), fault.kind, fault.step, host), timeout=10)


def my_placement() -> WorkerPlacement:
    import jax
    import ray
    import ray.train
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    return WorkerPlacement(
        rank=ray.train.get_context().get_world_rank(),
        node_id=ray.get_runtime_context().get_node_id(),
        slice_name=os.environ.get("TPU_NAME", ""),
        tpu_worker_id=int(os.environ.get("TPU_WORKER_ID", "-1")),
        process_index=jax.process_index(),
        placement_group_id=group.id.hex() if group is not None else "",
    )


def report(metrics: dict[str, Any], *, final: bool) -> None:
    """``ray.train.report`` every ``log_every`` steps; the final report carries a small Ray Train
    checkpoint (rank 0 only) because Ray Train v2 returns to the driver only metrics attached to
    one."""
    import tempfile

    import ray.train

    if not final:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            Path(tmp, "summary.json").write_text(json.dumps(metrics), encoding="utf-8")
            checkpoint = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=checkpoint)


def quiet_worker_logs() -> None:
    """Orbax logs every array it writes at INFO through absl; keep warnings only."""
    import absl.logging

    absl.logging.set_verbosity(absl.logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)
    storage.quiet_clients()
