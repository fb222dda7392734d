"""SPMD training on TPU slices through Ray Train's JaxTrainer: the byte-level LM (data parallel),
or a preset on a hybrid mesh (``scale``), by one worker loop (:mod:`workloads.training.worker_loop`).

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytpu.catalog import SliceShape
from raytpu.errors import invalid
from workloads import ray_compat, storage, telemetry
from workloads.training import multislice
from workloads.training.config import (
    RunBoard,
    TrainConfig,
    TrainProgress,
    TrainResult,
)
from workloads.training.family_check import check_family
from workloads.training.faults import FaultPlan, check_hosts
from workloads.training.goodput import goodput
from workloads.training.recovery import EventBook
from workloads.training.worker_loop import train_loop_per_worker

__all__ = ["TrainingError", "TrainingInterrupted", "run_training"]

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class RunPlan:
    """A run checked and sized on the driver, before anything is reserved: what every attempt
    hands JaxTrainer."""

    shape: SliceShape
    run: TrainConfig
    num_slices: int
    tpu: int
    """TPU chips per worker."""
    num_workers: int
    pin: bool
    """Whether the workers also ask for the checked slice's own resource (see run_training)."""
    scale_payload: dict[str, Any] | None
    family: Any
    """A user's :class:`workloads.model.family.ModelFamily` (``run_training(..., family=...)``),
    handed to every worker as it is; None: the byte LM or ``scale``'s preset."""
    log_dir: Path
    storage_path: str
    filesystem: Any
    name: str
    reserve_timeout_s: float
    start_timeout_s: float

    def describe(self) -> str:
        return f"{self.num_slices} x {self.shape.name}"


@dataclass
class Attempts:
    """What the attempts of one run left: the last result, the waits, the event book, and
    what the board saw (progress, placements, restores)."""

    book: EventBook = field(default_factory=EventBook)
    waits: list[float | None] = field(default_factory=list)
    result: Any = None
    count: int = 0
    board_view: dict[str, Any] = field(default_factory=dict)


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
    family: Any = None,
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
    trains a preset on a hybrid mesh instead of the byte model (:mod:`workloads.training.multislice`).
    ``family`` is the library entry point for a team's own JAX model: any object with the
    training half of :class:`workloads.model.family.ModelFamily` (init, train step, mesh and
    shardings, batches; see ``docs/workloads/own-model.md``), trained by the same worker loop
    with everything above; its module is pickled by value, so the workers need not import it.
    Raises :class:`TrainingError`, and ``ValueError`` for a bad config before anything is
    reserved.
    """
    plan = _plan(
        shape, run, num_slices, tpu_per_worker, scale, family, storage_path, name,
        reserve_timeout_s, start_timeout_s,
    )  # fmt: skip
    began = time.time()
    with _run_board(on_progress) as board, ExitStack() as cordoned:
        attempts = _run_attempts(plan, board, cordoned, on_progress is not None)
    return _result(plan, attempts, time.time() - began)


def _plan(
    shape: SliceShape,
    run: TrainConfig,
    num_slices: int,
    tpu_per_worker: int | None,
    scale: Any,
    family: Any,
    storage_path: str | None,
    name: str,
    reserve_timeout_s: float,
    start_timeout_s: float,
) -> RunPlan:
    """Check the run against the slices (``ValueError`` for a bad config) and size it."""
    from workloads.slices.reservation import ray_splits_slice

    run.validate(shape, num_slices)
    if family is not None:
        check_family(family, scale, run)
    scale_payload = scale and multislice.driver_payload(shape, num_slices, run.global_batch, scale)
    tpu = int(tpu_per_worker or shape.chips_per_host)
    num_workers = shape.workers(tpu) * num_slices
    storage.require_shared("train.checkpoint_dir", run.checkpoint_dir, num_workers)
    pin = ray_splits_slice(shape)
    if pin and num_slices > 1:
        raise ValueError(
            invalid(
                "num_slices",
                num_slices,
                "1 (its workers are pinned to the slice the capacity check found), or a shape "
                f"Ray reserves by slice name (e.g. {shape.generation.name} 4x4, or "
                f"{shape.topology} on an 8-chip machine type)",
                reason=f"for {shape.name}, Ray's JaxTrainer takes {shape.generation.name} "
                f"{shape.topology} for one host and would not keep each slice's workers on its "
                "own hosts",
            )
        )
    if run.goodput.faults:
        faults = FaultPlan.from_config(run.goodput.faults).faults
        check_hosts(faults, num_workers, run.steps, field="train.goodput.faults")
    log_dir = Path(run.goodput.log_dir or Path(tempfile.gettempdir(), "raytpu-runs", name))
    log_dir.mkdir(parents=True, exist_ok=True)
    filesystem = None
    if storage_path is None:
        storage_path, filesystem = storage.ray_train_storage(run.checkpoint_dir)
    return RunPlan(
        shape, run, num_slices, tpu, num_workers, bool(pin), scale_payload or None, family,
        log_dir, storage_path, filesystem, name, reserve_timeout_s, start_timeout_s,
    )  # fmt: skip


def _run_attempts(plan: RunPlan, board: Any, cordoned: ExitStack, progress: bool) -> Attempts:
    """Attempts until one finishes; each failed one recorded and, within ``max_restarts``,
    restarted with the faults not yet fired (:class:`TrainingError` past the limit)."""
    import ray

    faults = FaultPlan.from_config(plan.run.goodput.faults)
    done = Attempts()
    for attempt in range(plan.run.goodput.max_restarts + 1):
        done.count = attempt + 1
        trainer = _trainer(plan, board, faults, done, attempt, progress)
        try:
            done.result = _fit(plan, trainer)
        except ray.train.TrainingFailedError as error:
            faults = _failed(plan, board, cordoned, faults, done, error, attempt)
            continue
        done.book.finished(board)
        break
    done.board_view = {
        "progress": ray.get(board.progress.remote(), timeout=30),
        "placements": tuple(ray.get(board.placements.remote(), timeout=30)),
        "restores": tuple(tuple(r) for r in ray.get(board.restores.remote(), timeout=30)),
    }
    done.book.write(plan.log_dir)
    return done


def _trainer(
    plan: RunPlan, board: Any, faults: FaultPlan, done: Attempts, attempt: int, progress: bool
) -> Any:
    """The attempt's capacity check, then its JaxTrainer: one worker per host, every slice."""
    import ray
    import ray.train
    from ray.train.v2.jax import JaxTrainer

    shape = plan.shape
    checked_slices, placement_wait = _capacity_check(
        shape, plan.num_slices, plan.tpu, plan.reserve_timeout_s, plan.num_workers
    )
    done.waits.append(placement_wait)
    resources: dict[str, float] = {"TPU": plan.tpu}
    if plan.pin:
        # Every host of a slice carries the resource named after the slice (TPU_NAME):
        # asking for it keeps all workers on the slice the check found.
        resources[checked_slices[0]] = 1
    ray.get(board.new_attempt.remote(), timeout=30)
    return JaxTrainer(
        train_loop_per_worker=train_loop_per_worker,
        train_loop_config={
            "train": plan.run.to_dict(),
            "board": board,
            "show_progress": progress,
            "telemetry": telemetry.worker_config(shape, plan.num_slices),
            "faults": faults.to_config(),
            "skip_data": ray.get(board.skipped_data.remote(), timeout=30),
            "slow_hosts": dict(done.book.slow_hosts),
            "shape": shape,
            "run_name": plan.name,
            "scale": plan.scale_payload,
            "family": plan.family,
        },
        scaling_config=ray_compat.tpu_scaling_config(
            plan.num_workers, shape.topology, shape.ray_accelerator_type, resources
        ),
        run_config=ray.train.RunConfig(
            name=f"{plan.name}-{attempt}" if attempt else plan.name,
            storage_path=plan.storage_path,
            storage_filesystem=plan.filesystem,
            # This loop restarts (a capacity check, the faults not yet fired, the event
            # account): Ray Train retries nothing itself, preemptions included.
            failure_config=ray_compat.no_retries_failure_config(),
        ),
    )


def _fit(plan: RunPlan, trainer: Any) -> Any:
    """``trainer.fit()`` within the worker group start bound, the caller's SIGINT handler kept."""
    began = time.monotonic()
    try:
        with (
            _env(ray_compat.WORKER_GROUP_START_TIMEOUT_ENV, str(plan.start_timeout_s)),
            _sigint_kept(),
        ):
            return trainer.fit()
    except SystemExit as error:
        # Ray Train's own SIGINT handler aborts the run and leaves through sys.exit().
        raise TrainingInterrupted(
            f"training on {plan.describe()} was interrupted (SIGINT) after "
            f"{time.monotonic() - began:.0f} s; Ray Train aborted the run"
        ) from error


def _failed(
    plan: RunPlan,
    board: Any,
    cordoned: ExitStack,
    faults: FaultPlan,
    done: Attempts,
    error: BaseException,
    attempt: int,
) -> FaultPlan:
    """Record a failed attempt, hold a slow host's slice; the faults left for the next one, or
    :class:`TrainingError` with the events when it may not restart."""
    book = done.book
    telemetry.error("train", error, telemetry.labels_for(plan.shape))
    held = len(book.cordons)
    restartable = book.failed(board, error, plan.log_dir, attempt < plan.run.goodput.max_restarts)
    for slice_name in book.cordons[held:]:
        _cordon(cordoned, plan.shape, slice_name, plan.reserve_timeout_s)
    book.write(plan.log_dir)
    if not restartable:
        raise TrainingError(
            f"training on {plan.describe()} ({plan.num_workers} workers of TPU {plan.tpu}) "
            f"failed after {attempt + 1} attempt(s): {error}\n" + book.summary()
        ) from error
    return faults.without(book.fired)


def _result(plan: RunPlan, done: Attempts, wall: float) -> TrainResult:
    """The finished run's :class:`TrainResult` from its final report and the board."""
    metrics = (done.result.metrics if done.result is not None else None) or {}
    if "params_digest" not in metrics:
        raise TrainingError(
            f"training on {plan.shape.name} ended without a final report: {metrics}"
        )
    progress = done.board_view["progress"]
    ratio = goodput(progress["productive_s"], wall)
    telemetry.goodput(ratio, done.book.events, telemetry.labels_for(plan.shape))
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
        checkpoint_dir=plan.run.checkpoint_dir,
        latest_checkpoint=int(metrics["latest_checkpoint"]),
        params_digest=str(metrics["params_digest"]),
        seconds=float(metrics["seconds"]),
        placement_wait_s=done.waits[0],
        placements=done.board_view["placements"],
        events=tuple(done.book.events),
        attempts=done.count,
        restores=done.board_view["restores"],
        goodput=ratio,
        wall_s=wall,
        redone_steps=int(progress["redone_steps"]),
        log_dir=str(plan.log_dir),
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
