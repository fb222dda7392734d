"""The serving engine of one replica: batches of prompts through the prefix cache, one prefill,
and decode loops on the device (:mod:`workloads.decode`), padded to the replica's batch buckets.

:meth:`Engine.generate` returns whole completions; :meth:`Engine.stream` yields them in chunks of
``chunk`` tokens (each chunk one compiled decode loop), for server-sent events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from workloads import decode
from workloads.prefix_cache import PrefixCache

STREAM_CHUNK = 8
"""Tokens per decode loop when streaming (after the first token, which comes alone)."""


@dataclass(frozen=True)
class Row:
    prompt: str
    max_new_tokens: int
    temperature: float


@dataclass
class Timing:
    """Where a batch's time went (seconds) and what the prefix cache saved."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    first_token_s: float = 0.0
    tiers: list[str] = field(default_factory=list)
    """Per row: the tier of its last prefix-cache hit, ``""`` for none."""
    starts: list[int] = field(default_factory=list)
    """Per row: prompt tokens taken from the prefix cache (its prefill starts there)."""


PAD_ROW = Row(" ", 1, 0.0)


class Engine:
    """``params`` (replicated over ``mesh``) and ``cfg``; batches padded to ``buckets`` rows."""

    def __init__(
        self,
        params: Any,
        cfg: Any,
        mesh: Any,
        buckets: tuple[int, ...],
        prefix: PrefixCache | None = None,
        cap: int = 256,
    ) -> None:
        self.params, self.cfg, self.mesh = params, cfg, mesh
        self.buckets, self.prefix, self.cap = buckets, prefix, cap

    def _padded(self, rows: list[Row]) -> list[Row]:
        if not 1 <= len(rows) <= self.buckets[-1]:
            raise ValueError(f"batch size: {len(rows)} is not valid; valid: 1..{self.buckets[-1]}")
        size = next(b for b in self.buckets if b >= len(rows))
        return [*rows, *[PAD_ROW] * (size - len(rows))]

    def _prefill(self, rows: list[Row], seed: int, timing: Timing) -> decode.DecodeState:
        began = time.perf_counter()
        batch = self._padded(rows)
        ids = [decode.prompt_ids(self.cfg, r.prompt, r.max_new_tokens) for r in batch]
        kv = decode.new_cache(self.cfg, len(batch), self.mesh)
        starts = [0] * len(batch)
        if self.prefix is not None:
            kv, starts, timing.tiers = self.prefix.load(kv, ids)
        temps = [r.temperature for r in batch]
        state = decode.prefill(self.params, self.cfg, kv, ids, starts, temps, seed, self.mesh)
        if self.prefix is not None:
            self.prefix.store(state.kv, ids[: len(rows)], starts[: len(rows)])
        state.logits.block_until_ready()
        timing.prefill_s = time.perf_counter() - began
        timing.prefill_tokens = sum(len(i) - s for i, s in zip(ids, starts, strict=True))
        timing.cached_tokens = sum(starts[: len(rows)])
        timing.starts = list(starts[: len(rows)])
        return state

    def generate(self, rows: list[Row], seed: int) -> tuple[list[list[int]], Timing]:
        """New tokens per row (each cut at its ``max_new_tokens``) and the batch's timing."""
        timing = Timing()
        state = self._prefill(rows, seed, timing)
        began = time.perf_counter()
        steps = max(r.max_new_tokens for r in rows)
        tokens, _ = decode.decode(self.params, self.cfg, state, steps, cap=self.cap)
        timing.decode_s = time.perf_counter() - began
        timing.first_token_s = timing.prefill_s + timing.decode_s / steps
        return [t[: r.max_new_tokens].tolist() for t, r in zip(tokens, rows, strict=False)], timing

    def stream(
        self, rows: list[Row], seed: int, chunk: int = STREAM_CHUNK, timing: Timing | None = None
    ) -> Iterator[list[list[int]]]:
        """New tokens per row in chunks: the first token alone (the time to first token is
        prefill plus one step), then ``chunk`` at a time, each chunk one compiled decode loop.
        A row's list is empty once it has all it asked for."""
        timing = timing or Timing()
        state = self._prefill(rows, seed, timing)
        steps = max(r.max_new_tokens for r in rows)
        done = 0
        began = time.perf_counter()
        while done < steps:
            size = min(1 if done == 0 else chunk, steps - done)
            tokens, state = decode.decode(self.params, self.cfg, state, size, cap=chunk)
            if done == 0:
                timing.first_token_s = timing.prefill_s + time.perf_counter() - began
            yield [
                t[: max(0, min(size, r.max_new_tokens - done))].tolist()
                for t, r in zip(tokens, rows, strict=False)
            ]
            done += size
        timing.decode_s = time.perf_counter() - began

    def warm_up(self, every_length: bool = True) -> None:
        """Compile what a request needs, now: for each batch bucket both decode loop widths
        (whole completions and stream chunks) and the prefill of every length bucket up to
        ``context_len`` (only the shortest unless ``every_length``: the others then compile on
        the first request that needs them). The prefix cache is left out."""
        prefix, self.prefix = self.prefix, None
        try:
            for size in self.buckets:
                rows = [PAD_ROW] * size
                for _ in self.stream(rows, seed=0):
                    pass
                length = decode.MIN_BUCKET
                while length <= (self.cfg.context_len if every_length else decode.MIN_BUCKET):
                    self.generate([Row("x" * (length - 1), 1, 0.0)] * size, seed=0)
                    length *= 2
        finally:
            self.prefix = prefix
