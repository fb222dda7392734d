"""The batch job's driver: check the input, reserve whole slices, run Ray Data on their hosts.

Glossary (Ray's words):

- **reservation**: :func:`workloads.slices.reservation.reserve_slices`, ``num_slices`` whole
  slices in one placement group, one bundle ``{"TPU": chips per host, "CPU": 1}`` per host; held
  until the job ends, released on every path out (try / release / re-raise).
- **actor pool**: ``map_batches(BatchPredictor, compute=ActorPoolStrategy(size=hosts))`` with
  ``resources={"TPU": chips per host}``, ``num_cpus=1`` and the reservation's placement group as
  scheduling strategy: each actor takes a whole bundle, so one actor per host of the reserved
  slices, and never a host outside them. Ray Data restarts a dead actor in its bundle (its
  default ``max_restarts=-1``) and retries the chunk it held (``max_task_retries=-1``).
- **block**: one chunk of ``chunk_rows`` prompts (:mod:`workloads.batch.files`), made here from
  the checked rows, so that a chunk is the same rows on every run; done chunks (their file
  exists) are left out: a job run again after a failure does only what is missing.

Bounded: the reservation by ``reserve_timeout_s``, the run by ``timeout_s`` (a ``TimeoutError``
naming the chunks left), and a lost host ends the run with
:class:`workloads.slices.reservation.HostLostError` instead of a wait.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from raytpu.catalog import SliceShape
from raytpu.errors import invalid
from workloads.batch import files
from workloads.batch.predictor import BatchPredictor, PredictorConfig

DEFAULT_CHUNK_ROWS = 128
DEFAULT_BATCH_SIZE = 32
MAX_BATCH_SIZE = 256
POLL_S = 1.0


@dataclass(frozen=True)
class BatchConfig:
    """One batch job, as ``raytpu batch`` takes it; :meth:`validate` before anything starts."""

    input: str
    output: str
    checkpoint_dir: str
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    batch_size: int = DEFAULT_BATCH_SIZE
    max_new_tokens: int = 32
    temperature: float = 0.0
    seed: int = 0
    prefix_cache: bool = True
    reserve_timeout_s: float = 60.0
    timeout_s: float = 3600.0
    kill_chunk: int | None = None

    def validate(self) -> None:
        from workloads.serving.requests import MAX_NEW_TOKENS, MAX_TEMPERATURE

        checks: list[tuple[str, Any, str, bool]] = [
            ("chunk_rows", self.chunk_rows, "an integer 1..100000", 1 <= self.chunk_rows <= 10**5),
            (
                "batch_size",
                self.batch_size,
                f"an integer 1..{MAX_BATCH_SIZE}",
                1 <= self.batch_size <= MAX_BATCH_SIZE,
            ),
            (
                "max_new_tokens",
                self.max_new_tokens,
                f"an integer 1..{MAX_NEW_TOKENS}",
                1 <= self.max_new_tokens <= MAX_NEW_TOKENS,
            ),
            (
                "temperature",
                self.temperature,
                f"a number 0..{MAX_TEMPERATURE}",
                0 <= self.temperature <= MAX_TEMPERATURE,
            ),
            ("seed", self.seed, "an integer >= 0", self.seed >= 0),
            (
                "reserve_timeout_s",
                self.reserve_timeout_s,
                "seconds > 0",
                self.reserve_timeout_s > 0,
            ),
            ("timeout_s", self.timeout_s, "seconds > 0", self.timeout_s > 0),
        ]
        for name, value, valid, ok in checks:
            if not ok:
                raise ValueError(invalid(name, value, valid))
        if self.output.rstrip("/") == self.input.rstrip("/"):
            raise ValueError(invalid("output", self.output, "a folder other than the input"))


def check_rows(prompts: list[files.Prompt]) -> None:
    """Each prompt's own ``max_new_tokens`` / ``temperature``, within the serving bounds."""
    from workloads.serving.requests import MAX_NEW_TOKENS, MAX_TEMPERATURE

    for p in prompts:
        where = f"row {p.row}"
        if p.max_new_tokens is not None and not 1 <= p.max_new_tokens <= MAX_NEW_TOKENS:
            valid = f"an integer 1..{MAX_NEW_TOKENS}"
            raise ValueError(invalid(f"{where}.max_new_tokens", p.max_new_tokens, valid))
        if p.temperature is not None and not 0 <= p.temperature <= MAX_TEMPERATURE:
            valid = f"a number 0..{MAX_TEMPERATURE}"
            raise ValueError(invalid(f"{where}.temperature", p.temperature, valid))


@dataclass(frozen=True)
class BatchPlan:
    """A checked job: its prompts, its chunks and which of them are left to do."""

    config: BatchConfig
    prompts: list[files.Prompt]
    chunks: list[range]
    pending: list[int]
    resumed: bool

    @property
    def pending_rows(self) -> int:
        return sum(len(self.chunks[c]) for c in self.pending)


def plan_batch(config: BatchConfig, *, write_job_file: bool = True) -> BatchPlan:
    """Read and check every prompt, then the output folder (another job's outputs refused; this
    job's done chunks skipped). ``ValueError`` naming the field; nothing is started."""
    config.validate()
    prompts = files.read_prompts("input", config.input)
    check_rows(prompts)
    all_chunks = files.chunks(len(prompts), config.chunk_rows)
    if config.kill_chunk is not None and not 0 <= config.kill_chunk < len(all_chunks):
        raise ValueError(invalid("kill_chunk", config.kill_chunk, f"0..{len(all_chunks) - 1}"))
    identity = files.JobIdentity(
        input_digest=files.input_digest(prompts),
        rows=len(prompts),
        chunk_rows=config.chunk_rows,
        checkpoint=config.checkpoint_dir,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        seed=config.seed,
    )
    resumed = write_job_file and files.check_job_file("output", config.output, identity)
    done = files.done_chunks(config.output) if resumed else set()
    pending = [c for c in range(len(all_chunks)) if c not in done]
    return BatchPlan(config, prompts, all_chunks, pending, resumed)


@dataclass(frozen=True)
class ChunkDone:
    """One chunk written: by which host and process, how long it took."""

    chunk: int
    rows: int
    tokens: int
    seconds: float
    cached_tokens: int
    host: str
    pid: int


@dataclass
class BatchResult:
    """What a run did: the chunks it wrote, the output check, the time."""

    rows: int
    chunks_written: list[ChunkDone] = field(default_factory=list)
    skipped_chunks: int = 0
    hosts: int = 0
    reserve_s: float = 0.0
    run_s: float = 0.0
    check: files.OutputCheck | None = None
    slice_names: tuple[str, ...] = ()

    @property
    def rows_written(self) -> int:
        return sum(c.rows for c in self.chunks_written)

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.chunks_written)

    @property
    def rows_per_s(self) -> float:
        return self.rows_written / self.run_s if self.run_s else 0.0


def _blocks(plan: BatchPlan) -> list[Any]:
    """One Arrow table per pending chunk: the Ray Data blocks (``-1`` / ``0``: the job's
    default temperature / max_new_tokens)."""
    import pyarrow as pa

    tables = []
    for chunk in plan.pending:
        rows = [plan.prompts[r] for r in plan.chunks[chunk]]
        tables.append(
            pa.table(
                {
                    "row": pa.array([p.row for p in rows], pa.int64()),
                    "chunk": pa.array([chunk] * len(rows), pa.int64()),
                    "chunk_len": pa.array([len(rows)] * len(rows), pa.int64()),
                    "id": pa.array([p.id for p in rows], pa.string()),
                    "prompt": pa.array([p.prompt for p in rows], pa.string()),
                    "max_new_tokens": pa.array([p.max_new_tokens or 0 for p in rows], pa.int64()),
                    "temperature": pa.array(
                        [-1.0 if p.temperature is None else p.temperature for p in rows],
                        pa.float64(),
                    ),
                }
            )
        )
    return tables


def _dataset(plan: BatchPlan, reservation: Any) -> Any:
    """The job's Ray Data pipeline on the reserved hosts (nothing runs until it is read)."""
    import ray.data
    from ray.data import ActorPoolStrategy

    config = plan.config
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the command shows its own
    predictor = PredictorConfig(
        checkpoint_dir=config.checkpoint_dir,
        output=config.output,
        batch_size=config.batch_size,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        seed=config.seed,
        prefix_cache=config.prefix_cache,
        kill_chunk=config.kill_chunk,
    )
    with warnings.catch_warnings():
        # Ray 2.60 has no named parameter for a placement group: ``scheduling_strategy`` goes
        # through ``**ray_remote_args``, which it marks deprecated (to go in 2.64; Ray is pinned).
        warnings.simplefilter("ignore", DeprecationWarning)
        return _map(ray.data.from_arrow(_blocks(plan)), predictor, reservation, ActorPoolStrategy)


def _map(dataset: Any, predictor: PredictorConfig, reservation: Any, pool: Any) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    shape = reservation.shape
    return dataset.map_batches(
        BatchPredictor,
        fn_constructor_args=(predictor,),
        batch_size=None,  # a batch is a whole block: one chunk
        batch_format="numpy",
        compute=pool(size=len(reservation.hosts)),
        num_cpus=reservation.bundle_resources["CPU"],
        resources={"TPU": float(shape.chips_per_host)},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=reservation.placement_group,
            placement_group_bundle_index=-1,  # any bundle: each actor fills one whole
        ),
    )


def _summaries(dataset: Any, reservation: Any, deadline: float) -> Iterator[ChunkDone]:
    """The pipeline's summary rows as they come, read in a thread so that the wait is bounded
    (``TimeoutError``) and a lost reserved host ends it (``HostLostError``)."""
    rows: queue.Queue[Any] = queue.Queue()
    end = object()

    def read() -> None:
        try:
            for row in dataset.iter_rows():
                rows.put(row)
            rows.put(end)
        except BaseException as error:  # handed to the driver's thread
            rows.put(error)

    threading.Thread(target=read, name="raytpu-batch-read", daemon=True).start()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("batch job not done within its timeout_s")
        try:
            item = rows.get(timeout=min(POLL_S, remaining))
        except queue.Empty:
            reservation.check_hosts()
            continue
        if item is end:
            return
        if isinstance(item, BaseException):
            raise item
        yield ChunkDone(
            chunk=int(item["chunk"]),
            rows=int(item["rows"]),
            tokens=int(item["tokens"]),
            seconds=float(item["seconds"]),
            cached_tokens=int(item["cached_tokens"]),
            host=str(item["host"]),
            pid=int(item["pid"]),
        )


def run_batch(
    shape: SliceShape,
    plan: BatchPlan,
    *,
    num_slices: int = 1,
    on_chunk: Callable[[ChunkDone], None] | None = None,
    on_reserved: Callable[[Any], None] | None = None,
) -> BatchResult:
    """Run ``plan``'s pending chunks on ``num_slices`` reserved slices of ``shape``; every row is
    then checked to be in the output exactly once (:func:`workloads.batch.files.check_outputs`).
    The reservation is released on every path out."""
    from workloads.slices.reservation import reserve_slices

    config = plan.config
    result = BatchResult(
        rows=len(plan.prompts), skipped_chunks=len(plan.chunks) - len(plan.pending)
    )
    if plan.pending:
        began = time.monotonic()
        with reserve_slices(
            shape, num_slices, timeout_s=config.reserve_timeout_s, name="raytpu-batch"
        ) as reservation:
            result.reserve_s = time.monotonic() - began
            result.hosts, result.slice_names = len(reservation.hosts), reservation.slice_names
            if on_reserved is not None:
                on_reserved(reservation)
            began = time.monotonic()
            dataset = _dataset(plan, reservation)
            for done in _summaries(dataset, reservation, began + config.timeout_s):
                result.chunks_written.append(done)
                if on_chunk is not None:
                    on_chunk(done)
            result.run_s = time.monotonic() - began
    files.remove_temporaries(config.output)
    result.check = files.check_outputs(config.output, len(plan.prompts))
    return result
