"""Data-parallel SPMD training of the byte-level LM on TPU slices through Ray Train's JaxTrainer.

Glossary (Ray's words):

- **worker**: one Ray Train worker process per TPU host (``num_workers = hosts x slices``), sized
  ``{"TPU": chips per host}``. JaxTrainer reserves the slices (SlicePlacementGroup) and calls
  ``jax.distributed.initialize`` on every worker, so ``jax.devices()`` is every chip of every slice.
- **mesh**: a 1-D ``jax.sharding.Mesh`` over all those devices, axis ``data``. Each worker builds
  its share of the global batch and :func:`jax.make_array_from_process_local_data` assembles the
  global array; parameters are replicated; XLA all-reduces the gradients across hosts.
- **checkpoint**: an Orbax ``CheckpointManager`` directory written every ``checkpoint_every``
  steps by all workers together, each its own shards; a new run resumes from the latest step in
  it (:mod:`workloads.model.checkpoint`). It is ``gs://BUCKET/RUN`` whenever more than one host writes
  (the GCS emulator in the simulation): a TPU host does not see another host's disk
  (:mod:`workloads.storage`). Ray Train's own storage goes beside it, on the same bucket.
- **placement**: where each worker ran (its Ray node, slice name and ``TPU_WORKER_ID``), as the
  worker itself reports it at start; :attr:`TrainResult.placements`.

The driver never imports jax: the worker function does. ``python -m raytpu_cli train --help``.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from raytpu.catalog import SliceShape
from workloads import storage, telemetry
from workloads.training import multislice
from workloads.training.config import (
    RunBoard,
    TrainConfig,
    TrainProgress,
    TrainResult,
    WorkerPlacement,
)
from workloads.training.faults import FaultPlan, check_hosts
from workloads.training.goodput import goodput
from workloads.training.recovery import EventBook
from workloads.training.worker_loop import train_loop_per_worker

__all__ = [
    "TrainConfig",
    "TrainProgress",
    "TrainResult",
    "TrainingError",
    "TrainingInterrupted",
    "WorkerPlacement",
    "run_training",
    "train_loop_per_worker",
]

logger = logging.getLogger(__name__)

WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
"""Ray Train v2 bound on starting the worker group (default 60 s, then it retries)."""


class TrainingError(RuntimeError):
    """A training run that did not start or did not finish; names the shape and the cause."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C while ``JaxTrainer.fit()`` ran: Ray Train aborted the run (its SIGINT handler)."""


PROGRESS_POLL_S = 0.5


HEAD_RESOURCE = "node:__internal_head__"
"""The resource Ray gives the head node only."""


@contextmanager
def _run_board(on_progress: Callable[[TrainProgress], None] | None) -> Iterator[Any]:
    """Yield the run's board for the workers and, while the block runs, call ``on_progress``
    (if given) from a driver thread whenever a new step arrives."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # On the head node: the board outlives the attempts, so it must not sit on a TPU host that
    # may be lost or preempted (the head is a CPU pod; Ray gives it this resource).
    heads = [
        n["NodeID"]
        for n in ray.nodes()
        if n["Alive"] and HEAD_RESOURCE in (n.get("Resources") or {})
    ]
    options: dict[str, Any] = {}
    if heads:  # hard: a soft affinity let Ray place it on a TPU host under load
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(heads[0], soft=False)
    board = ray.remote(num_cpus=0)(RunBoard).options(**options).remote()
    if on_progress is None:
        try:
            yield board
        finally:
            ray.kill(board)
        return
    stop = threading.Event()

    def poll() -> None:
        seen: TrainProgress | None = None
        while not stop.wait(PROGRESS_POLL_S):
            try:
                latest = ray.get(board.latest.remote(), timeout=5)
            except (GetTimeoutError, RayActorError):
                continue
            if latest is not None and latest != seen:
                seen = latest
                on_progress(latest)

    thread = threading.Thread(target=poll, name="train-progress", daemon=True)
    thread.start()
    try:
        yield board
    finally:
        stop.set()
        thread.join(timeout=10)
        ray.kill(board)


# ------------------------------------------------------------------------------- driver side
@contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@contextmanager
def _sigint_kept() -> Iterator[None]:
    """``JaxTrainer.fit()`` installs its own SIGINT handler and leaves it installed: put the
    caller's back afterwards (main thread only, as Ray Train does)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_training(
    shape: SliceShape,
    run: TrainConfig,
    *,
    num_slices: int = 1,
    tpu_per_worker: int | None = None,
    reserve_timeout_s: float = 30.0,
    start_timeout_s: float = 60.0,
    storage_path: str | None = None,
    name: str = "raytpu-train",
    on_progress: Callable[[TrainProgress], None] | None = None,
    scale: Any = None,
) -> TrainResult:
    """Train on ``num_slices`` slices of ``shape`` in the connected Ray cluster.

    First a capacity check: the slices are reserved with
    :func:`workloads.slices.reservation.reserve_slices` (sized exactly as the workers will be) and
    released, so that a request no slice can hold fails within ``reserve_timeout_s`` with the
    reason. Then JaxTrainer reserves the slices itself (its SlicePlacementGroup) and runs with no
    Ray Train retries and a worker group start bound of ``start_timeout_s``. A failed attempt (a
    lost host or worker, a hang, a preemption) is recorded (:class:`workloads.training.recovery.EventBook`)
    and, up to ``run.goodput.max_restarts`` times, started again (capacity check included) on a
    whole slice from the newest checkpoint of either tier (:mod:`workloads.training.checkpoint_tiers`); past the
    limit, :class:`TrainingError` lists the events. The slices and hosts the
    result reports are the ones its workers ran on (:attr:`TrainResult.placements`), not the
    check's. For a shape whose hosts Ray's reservation would not keep together
    (:func:`workloads.slices.reservation.ray_splits_slice`: v5e/v6e 2x4 on 4-chip hosts) the workers
    also ask for the checked slice's own resource, so they run on its hosts and nowhere else.
    ``storage_path`` (Ray Train's) defaults to a folder beside the checkpoint directory
    (:func:`workloads.storage.ray_train_storage`). ``on_progress`` is called (from a driver
    thread) with each new :class:`TrainProgress`. ``scale`` (a :class:`raytpu.presets.ScaleConfig`)
    trains a preset on a hybrid mesh instead of the byte model (:mod:`workloads.training.multislice`). Raises :class:`TrainingError`, and
    ``ValueError`` for a bad config before anything is reserved.
    """
    import ray
    import ray.train
    from ray.train.v2.jax import JaxTrainer

    from workloads.slices.reservation import ray_splits_slice

    run.validate(shape, num_slices)
    scale_payload = scale and multislice.driver_payload(shape, num_slices, run.global_batch, scale)
    tpu = int(tpu_per_worker or shape.chips_per_host)
    num_workers = shape.workers(tpu) * num_slices
    storage.require_shared("train.checkpoint_dir", run.checkpoint_dir, num_workers)
    pin = ray_splits_slice(shape)
    if pin and num_slices > 1:
        raise ValueError(
            f"num_slices: {num_slices} is not valid for {shape.name}: Ray's JaxTrainer takes "
            f"{shape.generation.name} {shape.topology} for one host and would not keep each "
            "slice's workers on its own hosts; valid: 1 (its workers are pinned to the slice "
            "the capacity check found), or a shape Ray reserves by slice name "
            f"(e.g. {shape.generation.name} 4x4, or {shape.topology} on an 8-chip machine type)"
        )
    if run.goodput.faults:
        check_hosts(
            FaultPlan.from_config(run.goodput.faults).faults,
            num_workers,
            run.steps,
            field="train.goodput.faults",
        )
    log_dir = Path(run.goodput.log_dir or Path(tempfile.gettempdir(), "raytpu-runs", name))
    log_dir.mkdir(parents=True, exist_ok=True)
    if storage_path is None:
        storage_path, filesystem = storage.ray_train_storage(run.checkpoint_dir)
    else:
        filesystem = None
    plan = FaultPlan.from_config(run.goodput.faults)
    book = EventBook()
    waits: list[float | None] = []
    began = time.time()
    with _run_board(on_progress) as board, ExitStack() as cordoned:
        for attempt in range(run.goodput.max_restarts + 1):
            checked_slices, placement_wait = _capacity_check(
                shape, num_slices, tpu, reserve_timeout_s, num_workers
            )
            waits.append(placement_wait)
            resources: dict[str, float] = {"TPU": tpu}
            if pin:
                # Every host of a slice carries the resource named after the slice (TPU_NAME):
                # asking for it keeps all workers on the slice the check found.
                resources[checked_slices[0]] = 1
            ray.get(board.new_attempt.remote(), timeout=30)
            trainer = JaxTrainer(
                train_loop_per_worker=train_loop_per_worker,
                train_loop_config={
                    "train": run.to_dict(),
                    "board": board,
                    "show_progress": on_progress is not None,
                    "telemetry": telemetry.worker_config(shape, num_slices),
                    "faults": plan.to_config(),
                    "skip_data": ray.get(board.skipped_data.remote(), timeout=30),
                    "slow_hosts": dict(book.slow_hosts),
                    "shape": shape,
                    "run_name": name,
                    "scale": scale_payload,
                },
                scaling_config=ray.train.ScalingConfig(
                    use_tpu=True,
                    num_workers=num_workers,
                    topology=shape.topology,
                    accelerator_type=shape.ray_accelerator_type,
                    resources_per_worker=resources,
                ),
                run_config=ray.train.RunConfig(
                    name=f"{name}-{attempt}" if attempt else name,
                    storage_path=storage_path,
                    storage_filesystem=filesystem,
                    # This loop restarts (a capacity check, the faults not yet fired, the
                    # event account): Ray Train retries nothing itself, preemptions included.
                    failure_config=ray.train.FailureConfig(
                        max_failures=0, controller_failure_limit=0, max_preemption_failures=0
                    ),
                ),
            )
            attempt_began = time.monotonic()
            try:
                with _env(WORKER_GROUP_START_TIMEOUT_ENV, str(start_timeout_s)), _sigint_kept():
                    result = trainer.fit()
            except SystemExit as error:
                # Ray Train's own SIGINT handler aborts the run and leaves through sys.exit().
                raise TrainingInterrupted(
                    f"training on {num_slices} x {shape.name} was interrupted (SIGINT) after "
                    f"{time.monotonic() - attempt_began:.0f} s; Ray Train aborted the run"
                ) from error
            except ray.train.TrainingFailedError as error:
                telemetry.error("train", error, telemetry.labels_for(shape))
                held = len(book.cordons)
                restartable = book.failed(board, error, log_dir, attempt < run.goodput.max_restarts)
                plan = plan.without(book.fired)
                for slice_name in book.cordons[held:]:
                    _cordon(cordoned, shape, slice_name, reserve_timeout_s)
                book.write(log_dir)
                if not restartable:
                    raise TrainingError(
                        f"training on {num_slices} x {shape.name} ({num_workers} workers of TPU "
                        f"{tpu}) failed after {attempt + 1} attempt(s): {error}\n" + book.summary()
                    ) from error
                continue
            book.finished(board)
            break
        progress = ray.get(board.progress.remote(), timeout=30)
        placements = tuple(ray.get(board.placements.remote(), timeout=30))
        restores = tuple(tuple(r) for r in ray.get(board.restores.remote(), timeout=30))
        book.write(log_dir)
    wall = time.time() - began
    metrics = result.metrics or {}
    if "params_digest" not in metrics:
        raise TrainingError(f"training on {shape.name} ended without a final report: {metrics}")
    ratio = goodput(progress["productive_s"], wall)
    telemetry.goodput(ratio, book.events, telemetry.labels_for(shape))
    return TrainResult(
        steps_run=len(metrics["losses"]),
        final_step=int(metrics["step"]),
        resumed_from=int(metrics["resumed_from"]),
        first_loss=float(metrics["first_loss"]),
        last_loss=float(metrics["loss"]),
        losses=[float(x) for x in metrics["losses"]],
        process_count=int(metrics["process_count"]),
        device_count=int(metrics["device_count"]),
        local_device_count=int(metrics["local_device_count"]),
        checkpoint_dir=run.checkpoint_dir,
        latest_checkpoint=int(metrics["latest_checkpoint"]),
        params_digest=str(metrics["params_digest"]),
        seconds=float(metrics["seconds"]),
        placement_wait_s=waits[0],
        placements=placements,
        events=tuple(book.events),
        attempts=attempt + 1,
        restores=restores,
        goodput=ratio,
        wall_s=wall,
        redone_steps=int(progress["redone_steps"]),
        log_dir=str(log_dir),
        scale=dict(metrics.get("scale") or {}),
    )


def _cordon(stack: ExitStack, shape: SliceShape, slice_name: str, timeout_s: float) -> None:
    """Hold every host of ``slice_name`` (a slow host's slice) until ``stack`` closes, so that
    neither the capacity check nor JaxTrainer's own reservation lands on it again."""
    from workloads.slices.reservation import SliceReservationError, reserve_slices

    try:
        stack.enter_context(
            reserve_slices(shape, only=(slice_name,), timeout_s=timeout_s, name="raytpu-cordon")
        )
    except SliceReservationError as error:
        logger.warning("slice %s not held (%s): the next attempt may use it", slice_name, error)


def _capacity_check(
    shape: SliceShape, num_slices: int, tpu: int, timeout_s: float, num_workers: int
) -> tuple[tuple[str, ...], float | None]:
    """Reserve the slices as the workers will use them, and release them (see run_training)."""
    from workloads.slices.reservation import SliceReservationError, reserve_slices

    try:
        with reserve_slices(
            shape, num_slices, timeout_s=timeout_s, tpu_per_bundle=tpu
        ) as reservation:
            return reservation.slice_names, reservation.wait_s
    except SliceReservationError as error:
        raise TrainingError(
            f"training on {num_slices} x {shape.name} with {num_workers} workers of "
            f"TPU {tpu} cannot start: {error}"
        ) from error
