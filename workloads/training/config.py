"""The data of a training run: its config, what it reports, and the board its workers post to.

Stdlib only (the driver imports it; the workers too). :class:`RunBoard` is a Ray actor (0 CPUs)
of one run that lives across its attempts: placements, progress, goodput events
(:class:`workloads.training.goodput.GoodputEvent`), the faults that fired, per-step times, stack dumps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from raytpu.catalog import SliceShape
from raytpu.errors import invalid
from workloads.training.goodput import GoodputConfig, GoodputEvent


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
    """Overrides of :class:`workloads.model.byte_lm.ModelConfig` fields."""
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """Restarts, the fast checkpoint tier, detectors, policies, injected faults."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainConfig:
        return cls(**{**raw, "goodput": GoodputConfig.from_dict(raw.get("goodput") or {})})

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
                raise ValueError(invalid(f"train.{name}", value, valid))
        self.goodput.validate()


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
    """Where each worker ran (the last attempt), in rank order, as the workers reported it."""
    events: tuple[GoodputEvent, ...] = ()
    """Every fault of the run and what was done, in order (also in the run's ``events.jsonl``)."""
    attempts: int = 1
    restores: tuple[tuple[str, int], ...] = ()
    """Per attempt: the tier (``fast``, ``durable``, ``none``) and step it started from."""
    goodput: float = 0.0
    """Productive step time (steps kept in the final state) over the run's wall time."""
    wall_s: float = 0.0
    redone_steps: int = 0
    """Steps trained more than once: after a restart (back to the restored checkpoint) or a
    rollback, and those a preempted host trained after its emergency checkpoint."""
    log_dir: str = ""
    scale: dict[str, Any] = field(default_factory=dict)
    """A preset run's mesh, MEGASCALE_* and shard facts (:mod:`workloads.training.multislice`)."""

    @property
    def slice_names(self) -> tuple[str, ...]:
        """The slices the workers ran on (``TPU_NAME``), in rank order of first appearance."""
        return tuple(dict.fromkeys(p.slice_name for p in self.placements))

    @property
    def placement_groups(self) -> tuple[str, ...]:
        """The placement groups the workers ran in, as they saw it: the reservation this run
        reports is the one it used (the capacity check's is released before JaxTrainer's)."""
        return tuple(dict.fromkeys(p.placement_group_id for p in self.placements))


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
    placement_group_id: str = ""
    """Hex id of the placement group the worker runs in (JaxTrainer's slice reservation)."""


@dataclass(frozen=True)
class TrainProgress:
    """The newest step of a running training, as worker 0 saw it."""

    step: int
    steps: int
    loss: float
    tokens_per_s: float


class RunBoard:
    """A Ray actor (0 CPUs) of one run: every worker posts its :class:`WorkerPlacement` at start,
    worker 0 the newest :class:`TrainProgress` (when the driver shows progress)."""

    def __init__(self) -> None:
        self._latest: TrainProgress | None = None
        self._placements: dict[int, WorkerPlacement] = {}
        self._events: list[dict[str, Any]] = []
        self._fired: list[dict[str, Any]] = []
        self._restores: list[tuple[str, int]] = []
        self._step_s: dict[int, float] = {}
        self._last_step = 0
        self._executed = 0
        self._attempt_began: float | None = None
        self._skip_data: list[int] = []
        self._stacks: dict[str, str] = {}

    def post(self, progress: TrainProgress) -> None:
        self._latest = progress

    def latest(self) -> TrainProgress | None:
        return self._latest

    def placed(self, placement: WorkerPlacement) -> None:
        self._placements[placement.rank] = placement

    def placements(self) -> list[WorkerPlacement]:
        return [self._placements[rank] for rank in sorted(self._placements)]

    # -- goodput (kept across attempts) --------------------------------------------------
    def new_attempt(self) -> None:
        self._placements = {}
        self._attempt_began = None

    def event(self, raw: dict[str, Any]) -> None:
        self._events.append(raw)

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def fired(self, spec: str, kind: str, step: int, host: str) -> None:
        self._fired.append({"spec": spec, "kind": kind, "step": step, "host": host})

    def fired_faults(self) -> list[dict[str, Any]]:
        return list(self._fired)

    def restored(self, process_index: int, tier: str, step: int, host: str) -> None:
        if process_index == 0:
            self._restores.append((tier, step))

    def restores(self) -> list[tuple[str, int]]:
        return list(self._restores)

    def step(self, done: int, seconds: float, wall: float) -> None:
        """Worker 0 after each step: a step run again after a restart replaces its time."""
        self._step_s[done] = seconds
        self._last_step = done
        self._executed += 1
        if self._attempt_began is None:
            self._attempt_began = wall

    def progress(self) -> dict[str, Any]:
        return {
            "last_step": self._last_step,
            "first_step_wall": self._attempt_began,
            "productive_s": sum(self._step_s.values()),
            "redone_steps": self._executed - len(self._step_s),
        }

    def skip_data(self, indices: list[int]) -> None:
        self._skip_data = list(indices)

    def skipped_data(self) -> list[int]:
        return list(self._skip_data)

    def stacks(self, host: str, text: str) -> None:
        self._stacks[host] = text

    def stack_dumps(self) -> dict[str, str]:
        return dict(self._stacks)

    def clear_stacks(self) -> None:
        self._stacks = {}
