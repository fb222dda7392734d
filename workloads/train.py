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
  it (:mod:`workloads.checkpoint`). It is ``gs://BUCKET/RUN`` whenever more than one host writes
  (the GCS emulator in the simulation): a TPU host does not see another host's disk
  (:mod:`workloads.storage`). Ray Train's own storage goes beside it, on the same bucket.
- **placement**: where each worker ran (its Ray node, slice name and ``TPU_WORKER_ID``), as the
  worker itself reports it at start; :attr:`TrainResult.placements`.

The driver never imports jax: the worker function does. ``python -m raytpu_cli train --help``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from raytpu.catalog import SliceShape
from workloads import multislice, storage, telemetry

logger = logging.getLogger(__name__)

WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
"""Ray Train v2 bound on starting the worker group (default 60 s, then it retries)."""


class TrainingError(RuntimeError):
    """A training run that did not start or did not finish; names the shape and the cause."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C while ``JaxTrainer.fit()`` ran: Ray Train aborted the run (its SIGINT handler)."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run. ``checkpoint_dir`` may be ``gs://`` on a real cluster."""

    checkpoint_dir: str
    steps: int = 120
    global_batch: int = 32
    checkpoint_every: int = 40
    seed: int = 0
    log_every: int = 10
    """Steps per ``ray.train.report`` (each report carries the per-step losses of its window)."""
    model: dict[str, Any] = field(default_factory=dict)
    """Overrides of :class:`workloads.model.ModelConfig` fields."""

    def validate(self, shape: SliceShape, num_slices: int) -> None:
        devices = shape.chips * num_slices
        checks = [
            ("steps", self.steps, self.steps >= 1, "an integer >= 1"),
            ("checkpoint_every", self.checkpoint_every, self.checkpoint_every >= 1, ">= 1"),
            ("log_every", self.log_every, self.log_every >= 1, ">= 1"),
            (
                "global_batch",
                self.global_batch,
                self.global_batch >= devices and self.global_batch % devices == 0,
                f"a positive multiple of the {devices} devices of {num_slices} x {shape.name}",
            ),
        ]
        for name, value, ok, valid in checks:
            if not ok:
                raise ValueError(f"train.{name}: {value!r} is not valid; valid: {valid}")


@dataclass(frozen=True)
class TrainResult:
    """What a finished run reports back to the driver."""

    steps_run: int
    final_step: int
    resumed_from: int
    first_loss: float
    last_loss: float
    losses: list[float]
    process_count: int
    device_count: int
    local_device_count: int
    checkpoint_dir: str
    latest_checkpoint: int
    params_digest: str
    seconds: float
    placement_wait_s: float | None = None
    """How long the capacity check waited for free slices (see :func:`run_training`)."""
    placements: tuple[WorkerPlacement, ...] = ()
    """Where each worker ran, in rank order, as the workers reported it."""
    scale: dict[str, Any] = field(default_factory=dict)
    """A preset run's mesh, MEGASCALE_* and shard facts (:mod:`workloads.multislice`)."""

    @property
    def slice_names(self) -> tuple[str, ...]:
        """The slices the workers ran on (``TPU_NAME``), in rank order of first appearance."""
        return tuple(dict.fromkeys(p.slice_name for p in self.placements))


@dataclass(frozen=True)
class WorkerPlacement:
    """One Ray Train worker's own view of where it runs."""

    rank: int
    node_id: str
    """The Ray node (one per TPU host) of the worker process."""
    slice_name: str
    """``TPU_NAME`` of that host."""
    tpu_worker_id: int
    """``TPU_WORKER_ID``: the host's index inside its slice."""
    process_index: int
    """``jax.process_index()`` of the worker."""


@dataclass(frozen=True)
class TrainProgress:
    """The newest step of a running training, as worker 0 saw it."""

    step: int
    steps: int
    loss: float
    tokens_per_s: float


class _RunBoard:
    """A Ray actor (0 CPUs) of one run: every worker posts its :class:`WorkerPlacement` at start,
    worker 0 the newest :class:`TrainProgress` (when the driver shows progress)."""

    def __init__(self) -> None:
        self._latest: TrainProgress | None = None
        self._placements: dict[int, WorkerPlacement] = {}

    def post(self, progress: TrainProgress) -> None:
        self._latest = progress

    def latest(self) -> TrainProgress | None:
        return self._latest

    def placed(self, placement: WorkerPlacement) -> None:
        self._placements[placement.rank] = placement

    def placements(self) -> list[WorkerPlacement]:
        return [self._placements[rank] for rank in sorted(self._placements)]


PROGRESS_POLL_S = 0.5


@contextmanager
def _run_board(on_progress: Callable[[TrainProgress], None] | None) -> Iterator[Any]:
    """Yield the run's board for the workers and, while the block runs, call ``on_progress``
    (if given) from a driver thread whenever a new step arrives."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    board = ray.remote(num_cpus=0)(_RunBoard).remote()
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


# ---------------------------------------------------------------- worker side (jax imported here)
def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Runs once per TPU host. Must be called under JaxTrainer (jax.distributed is initialized)."""
    if config.get("scale"):  # a preset on a hybrid mesh (workloads.multislice)
        return multislice.train_loop_sharded(config, report=_report, placement=_my_placement)
    from functools import partial

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workloads import model as m
    from workloads.checkpoint import open_checkpoints, restore_state, save_state
    from workloads.corpus import load_corpus

    began = time.monotonic()
    _quiet_worker_logs()
    run = TrainConfig(**config["train"])
    cfg = m.ModelConfig.from_dict(run.model)
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("data",))
    data_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    local_batch = run.global_batch // jax.process_count()
    corpus = m.encode(load_corpus())
    board = config["board"]
    board.placed.remote(_my_placement())
    show_progress = config.get("show_progress", False) and jax.process_index() == 0
    tokens_per_step = run.global_batch * cfg.seq_len

    init = jax.jit(partial(m.init_state, cfg), out_shardings=replicated)
    state = init(jax.random.PRNGKey(run.seed))
    step_fn = jax.jit(
        partial(m.train_step, cfg),
        in_shardings=(replicated, data_sharding),
        out_shardings=(replicated, replicated),
        donate_argnums=0,
    )

    manager = open_checkpoints(run.checkpoint_dir)
    meter = telemetry.TrainTelemetry.from_config(config.get("telemetry"), run, cfg, state.params)
    resumed_from = 0
    try:
        latest = manager.latest_step()
        if latest is not None:
            with meter.checkpoint("restore"):
                state = restore_state(manager, latest, state)
            resumed_from = int(latest)
        losses: list[float] = []
        first_step = int(resumed_from)
        for step in range(first_step, run.steps):
            step_began = time.monotonic()
            local = m.sample_batch(
                corpus, local_batch, cfg.seq_len, seed=(run.seed, step, jax.process_index())
            )
            batch = jax.make_array_from_process_local_data(data_sharding, local)
            state, loss = step_fn(state, batch)
            loss_value = float(loss.addressable_data(0))
            losses.append(loss_value)
            done = step + 1
            if show_progress:
                seconds = max(time.monotonic() - step_began, 1e-9)
                board.post.remote(
                    TrainProgress(done, run.steps, loss_value, tokens_per_step / seconds)
                )
            meter.step(time.monotonic() - step_began, loss_value)
            telemetry.check_loss(done, loss_value)
            if jax.process_index() == 0:
                # A logger, not print: Ray Train tees a worker's print to stdout and its logger.
                logger.info("[train] step %d/%d loss %.4f", done, run.steps, loss_value)
            if done % run.checkpoint_every == 0 or done == run.steps:
                with meter.checkpoint("save"):
                    save_state(manager, done, state, cfg)
            if done % run.log_every == 0 and done != run.steps:
                # One report per window: each ray.train.report is a cross-worker round trip
                # (~1 s on the simulated cluster), the per-step losses travel inside it.
                window = losses[-run.log_every :]
                _report({"step": done, "loss": loss_value, "window_losses": window}, final=False)
        manager.wait_until_finished()
        _report(
            {
                "step": max(first_step, run.steps),
                "loss": losses[-1] if losses else float("nan"),
                "first_loss": losses[0] if losses else float("nan"),
                "losses": losses,
                "resumed_from": resumed_from,
                "process_count": jax.process_count(),
                "device_count": jax.device_count(),
                "local_device_count": jax.local_device_count(),
                "latest_checkpoint": int(manager.latest_step() or 0),
                "params_digest": m.params_digest(state.params),
                "seconds": time.monotonic() - began,
            },
            final=True,
        )
    finally:
        manager.close()


def _my_placement() -> WorkerPlacement:
    import jax
    import ray
    import ray.train

    return WorkerPlacement(
        rank=ray.train.get_context().get_world_rank(),
        node_id=ray.get_runtime_context().get_node_id(),
        slice_name=os.environ.get("TPU_NAME", ""),
        tpu_worker_id=int(os.environ.get("TPU_WORKER_ID", "-1")),
        process_index=jax.process_index(),
    )


def _report(metrics: dict[str, Any], *, final: bool) -> None:
    """``ray.train.report`` every step; the final report carries a small Ray Train checkpoint
    (rank 0 only) because Ray Train v2 returns to the driver only metrics attached to one."""
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


def _quiet_worker_logs() -> None:
    """Orbax logs every array it writes at INFO through absl; keep warnings only."""
    import absl.logging

    absl.logging.set_verbosity(absl.logging.WARNING)
    logging.getLogger("absl").setLevel(logging.WARNING)
    storage.quiet_clients()


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
    :func:`workloads.reservation.reserve_slices` (sized exactly as the workers will be) and
    released, so that a request no slice can hold fails within ``reserve_timeout_s`` with the
    reason. Then JaxTrainer reserves the slices itself (its SlicePlacementGroup) and runs with no
    retries and a worker group start bound of ``start_timeout_s``; the slices and hosts the
    result reports are the ones its workers ran on (:attr:`TrainResult.placements`), not the
    check's. For a shape whose hosts Ray's reservation would not keep together
    (:func:`workloads.reservation.ray_splits_slice`: v5e/v6e 2x4 on 4-chip hosts) the workers
    also ask for the checked slice's own resource, so they run on its hosts and nowhere else. ``storage_path`` (Ray Train's) defaults to a folder beside the checkpoint directory
    (:func:`workloads.storage.ray_train_storage`). ``on_progress`` is called (from a driver
    thread) with each new :class:`TrainProgress`. ``scale`` (a :class:`raytpu.presets.ScaleConfig`)
    trains a preset on a hybrid mesh instead of the byte model (:mod:`workloads.multislice`). Raises :class:`TrainingError`, and
    ``ValueError`` for a bad config before anything is reserved.
    """
    import ray.train
    from ray.train.v2.jax import JaxTrainer

    from workloads.reservation import SliceReservationError, ray_splits_slice, reserve_slices

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
    try:
        with reserve_slices(
            shape, num_slices, timeout_s=reserve_timeout_s, tpu_per_bundle=tpu
        ) as reservation:
            placement_wait = reservation.wait_s
            checked_slices = reservation.slice_names
    except SliceReservationError as error:
        raise TrainingError(
            f"training on {num_slices} x {shape.name} with {num_workers} workers of "
            f"TPU {tpu} cannot start: {error}"
        ) from error

    resources: dict[str, float] = {"TPU": tpu}
    if pin:
        # Every host of a slice carries the resource named after the slice (TPU_NAME): asking
        # for it keeps all workers on the slice the check found (free a moment ago).
        resources[checked_slices[0]] = 1
    if storage_path is None:
        storage_path, filesystem = storage.ray_train_storage(run.checkpoint_dir)
    else:
        filesystem = None
    with _run_board(on_progress) as board:
        trainer = JaxTrainer(
            train_loop_per_worker=train_loop_per_worker,
            train_loop_config={
                "train": asdict(run),
                "board": board,
                "show_progress": on_progress is not None,
                "telemetry": telemetry.worker_config(shape, num_slices),
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
                name=name,
                storage_path=storage_path,
                storage_filesystem=filesystem,
                failure_config=ray.train.FailureConfig(max_failures=0, controller_failure_limit=0),
            ),
        )
        began = time.monotonic()
        try:
            with _env(WORKER_GROUP_START_TIMEOUT_ENV, str(start_timeout_s)), _sigint_kept():
                result = trainer.fit()
        except SystemExit as error:
            # Ray Train's own SIGINT handler aborts the run and leaves through sys.exit().
            raise TrainingInterrupted(
                f"training on {num_slices} x {shape.name} was interrupted (SIGINT) after "
                f"{time.monotonic() - began:.0f} s; Ray Train aborted the run"
            ) from error
        except ray.train.TrainingFailedError as error:
            telemetry.error("train", error, telemetry.labels_for(shape))
            raise TrainingError(
                f"training on {num_slices} x {shape.name} ({num_workers} workers of TPU {tpu}) "
                f"failed after {time.monotonic() - began:.0f} s: {error}"
            ) from error
        placements = tuple(ray.get(board.placements.remote(), timeout=30))
    metrics = result.metrics or {}
    if "params_digest" not in metrics:
        raise TrainingError(f"training on {shape.name} ended without a final report: {metrics}")
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
        placement_wait_s=placement_wait,
        placements=placements,
        scale=dict(metrics.get("scale") or {}),
    )
