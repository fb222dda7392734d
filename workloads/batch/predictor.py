"""The batch job's Ray Data worker: one actor on one whole TPU host, the serving engine in it.

Glossary (Ray Data's words):

- **callable class**: :class:`BatchPredictor`, handed to ``Dataset.map_batches``; Ray Data makes
  one actor of it per host (``ActorPoolStrategy``, :mod:`workloads.batch.job`), calls
  ``__init__`` once (the checkpoint is loaded and the engine compiled there), then ``__call__``
  once per batch.
- **batch**: the rows of one or more chunks (:mod:`workloads.batch.files`), as numpy columns.
  Each chunk is run through the engine in engine batches of up to ``batch_size`` rows (padded
  to the replica's buckets, rows split over the host's chips), its prompts through the prefix
  cache, and written to its own file; the actor returns one summary row per chunk.

The engine is the serving replica's (:func:`workloads.serving.replica_model.load_replica_model`,
:class:`workloads.serving.engine.engine.Engine`): greedy rows give exactly the tokens a Serve
replica gives, and a sampled row has a seed of its own (:func:`row_seed`, from the job's seed
and the row's number, written with it): its tokens are a Serve request's with that ``seed``,
whatever batch either ran in. jax is imported in the actor, never in the driver.
"""

from __future__ import annotations

import hashlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.batch import files
from workloads.storage import is_remote, join

KILL_MARKER = "_killed-chunk-{chunk}"
"""``kill_chunk``'s mark in the output folder: the actor was killed there once (holding the pid)."""


@dataclass(frozen=True)
class PredictorConfig:
    """What every actor of one job is built with (pickled to each)."""

    checkpoint_dir: str
    output: str
    batch_size: int
    max_new_tokens: int
    temperature: float
    seed: int
    prefix_cache: bool = True
    kill_chunk: int | None = None
    """Fault injection (tests, docs): SIGKILL the actor's own process half-way through writing
    this chunk's file, the first time only (:data:`KILL_MARKER`)."""


def row_seed(seed: int, row: int) -> int:
    """Row ``row``'s sampling seed in a job of ``seed``: the same on a redo, in any chunking."""
    digest = hashlib.sha256(f"{seed}:{row}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def buckets_for(devices: int, batch_size: int) -> tuple[int, ...]:
    """The one padded engine batch size: ``batch_size`` rounded up to a multiple of
    ``devices`` (every chip gets rows). One bucket: a batch job's engine batches are full but
    for each chunk's last, and each bucket is more programs to compile on every actor start."""
    return (-(-batch_size // devices) * devices,)


class BatchPredictor:
    """One host's model and engine; ``__call__`` runs and writes whole chunks."""

    def __init__(self, config: PredictorConfig) -> None:
        from workloads.model import byte_lm as model
        from workloads.model import compile_cache
        from workloads.serving.replica import ServeOptions
        from workloads.serving.replica_model import load_replica_model

        began = time.perf_counter()
        compile_cache.from_env()
        self.config = config
        mesh = model.local_mesh()
        self.buckets = buckets_for(mesh.size, config.batch_size)
        options = ServeOptions(
            max_batch_size=self.buckets[-1],
            prefix_cache=config.prefix_cache,
            shared_prefix=False,
            precompile=False,
        )
        loaded = load_replica_model(
            config.checkpoint_dir, mesh, self.buckets, options, _ignore, _max_tokens(config)
        )
        # Every family's checkpoint decodes through the KV-cached engine.
        self.engine, self.family = loaded.engine, loaded.family
        self.fs = files.filesystem(config.output)
        self.host = f"{os.environ.get('TPU_NAME', '')}/{os.environ.get('TPU_WORKER_ID', '')}"
        self.load_s = time.perf_counter() - began
        print(f"batch predictor on {self.host}: ready in {self.load_s:.1f} s", flush=True)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        summary: dict[str, list[Any]] = {
            k: [] for k in ("chunk", "rows", "tokens", "seconds", "cached_tokens", "host", "pid")
        }
        for chunk in sorted({int(c) for c in batch["chunk"]}):
            where = np.flatnonzero(batch["chunk"] == chunk)
            expected = int(batch["chunk_len"][where[0]])
            if len(where) != expected:  # a part of a chunk would overwrite its whole file
                raise RuntimeError(
                    f"chunk {chunk}: {len(where)} of its {expected} rows in one batch; "
                    "a batch must hold whole chunks (map_batches batch_size=None, one block each)"
                )
            began = time.perf_counter()
            records, cached = self._complete({k: v[where] for k, v in batch.items()})
            self._write(chunk, records)
            summary["chunk"].append(chunk)
            summary["rows"].append(len(records))
            summary["tokens"].append(sum(len(r["tokens"]) for r in records))
            summary["seconds"].append(time.perf_counter() - began)
            summary["cached_tokens"].append(cached)
            summary["host"].append(self.host)
            summary["pid"].append(os.getpid())
        return {k: np.asarray(v) for k, v in summary.items()}

    def _complete(self, rows: dict[str, np.ndarray]) -> tuple[list[dict[str, Any]], int]:
        """Each row's record (in row order) and the prompt tokens the prefix cache served."""
        from workloads.serving.engine.engine import Row

        cfg, order = self.config, np.argsort(rows["row"], kind="stable")
        wanted = [
            Row(
                str(rows["prompt"][i]),
                int(rows["max_new_tokens"][i]) or cfg.max_new_tokens,
                float(rows["temperature"][i]) if rows["temperature"][i] >= 0 else cfg.temperature,
                row_seed(cfg.seed, int(rows["row"][i])),
            )
            for i in order
        ]
        tokens: list[list[int]] = []
        cached = 0
        for begin in range(0, len(wanted), cfg.batch_size):
            part = wanted[begin : begin + cfg.batch_size]
            got, timing = self.engine.generate(part, seed=0)  # every row has its own seed
            tokens += got
            cached += timing.cached_tokens
        records = [
            {
                "row": int(rows["row"][i]),
                "id": str(rows["id"][i]),
                "prompt": row.prompt,
                "max_new_tokens": row.max_new_tokens,
                "temperature": row.temperature,
                "seed": row.seed,
                "tokens": [int(t) for t in got],
                "completion": self._text(got),
            }
            for i, row, got in zip(order, wanted, tokens, strict=True)
        ]
        return records, cached

    def _text(self, tokens: list[int]) -> str:
        return self.family.decode(tokens)

    def _write(self, chunk: int, records: list[dict[str, Any]]) -> None:
        data = files.encode_lines(records)
        path = files.part_path(self.config.output, chunk)
        if chunk == self.config.kill_chunk:
            self._maybe_die(chunk, path, data)
        files.write_atomic(path, data, self.fs)

    def _maybe_die(self, chunk: int, path: str, data: bytes) -> None:
        """The injected fault: the first time, half the file under a temporary name, then
        SIGKILL (no clean-up runs: as a host's OOM killer or a preemption would)."""
        marker = join(self.config.output, KILL_MARKER.format(chunk=chunk))
        if self.fs.exists(marker):
            return
        files.write_atomic(marker, str(os.getpid()).encode(), self.fs)
        if not is_remote(path):  # what a writer killed before its rename leaves
            with open(files.temporary_name(path, os.getpid()), "wb") as handle:
                handle.write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)


def _ignore(*_: Any, **__: Any) -> None:
    """The prefix cache's counts callback: the job sums what the engine's timings say instead."""


def _max_tokens(config: PredictorConfig) -> int:
    """The compiled decode width: the job's default, at least (rows may ask for more, up to
    the serving bound)."""
    from workloads.serving.requests import MAX_NEW_TOKENS

    return max(config.max_new_tokens, MAX_NEW_TOKENS)
