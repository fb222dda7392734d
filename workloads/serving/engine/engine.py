"""The serving engine of one replica: batches of prompts through the prefix cache, one prefill,
and decode loops on the device (:mod:`workloads.serving.engine.decode`), padded to the replica's batch buckets.

:meth:`Engine.generate` returns whole completions; :meth:`Engine.stream` yields them in chunks of
``chunk`` tokens (each chunk one compiled decode loop), for server-sent events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from workloads.serving.engine import decode, prefill_plan
from workloads.serving.engine.prefix_cache import PrefixCache

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
    slots: list[int] = field(default_factory=list)
    """Per row: its slot in the batch (:func:`workloads.serving.engine.prefill_plan.place`)."""
    prefill_positions: int = 0
    """Token positions the prefill computed, padding included (:mod:`workloads.serving.engine.prefill_plan`)."""
    prefill_groups: int = 1
    """Prefill programs run: 1 for a joint prefill, else one per width group."""


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
        split_prefill: bool = True,
    ) -> None:
        self.params, self.cfg, self.mesh = params, cfg, mesh
        self.buckets, self.prefix, self.cap = buckets, prefix, cap
        self.split_prefill = split_prefill
        """False: every batch prefills jointly, padded to its longest prompt (the benchmark's
        side-by-side)."""

    def _size(self, rows: list[Row]) -> int:
        if not 1 <= len(rows) <= self.buckets[-1]:
            raise ValueError(f"batch size: {len(rows)} is not valid; valid: 1..{self.buckets[-1]}")
        return next(b for b in self.buckets if b >= len(rows))

    def _prefill(self, rows: list[Row], seed: int, timing: Timing) -> decode.DecodeState:
        """The batch's prefill, its rows in the slots :func:`prefill_plan.place` picks (by prompt
        length, before prefix-cache hits are known); ``timing.slots`` maps them back."""
        began = time.perf_counter()
        cfg, size = self.cfg, self._size(rows)
        devices = self.mesh.size if self.mesh is not None else 1
        asked = [decode.prompt_ids(cfg, r.prompt, r.max_new_tokens) for r in rows]
        widths = [decode.length_bucket(len(i), cfg.context_len) for i in asked]
        order = prefill_plan.place(widths, size, devices)
        batch = [PAD_ROW if i == prefill_plan.FILLER else rows[i] for i in order]
        ids = [
            decode.prompt_ids(cfg, PAD_ROW.prompt, 1) if i == prefill_plan.FILLER else asked[i]
            for i in order
        ]
        kv = decode.new_cache(cfg, size, self.mesh)
        starts, tiers = [0] * size, [""] * size
        if self.prefix is not None:
            kv, starts, tiers = self.prefix.load(kv, ids)
        temps = [r.temperature for r in batch]
        real = [i != prefill_plan.FILLER for i in order]
        plan = prefill_plan.plan_prefill(
            [
                decode.length_bucket(len(i) - s, cfg.context_len)
                for i, s in zip(ids, starts, strict=True)
            ],
            real,
            devices,
            self.buckets,
        )
        groups = plan.groups if self.split_prefill else ()
        state = decode.prefill(self.params, cfg, kv, ids, starts, temps, seed, self.mesh, groups)
        if self.prefix is not None:  # an empty slot's one pad token makes no block
            self.prefix.store(state.kv, ids, starts)
        state.logits.block_until_ready()
        slot_of = {request: slot for slot, request in enumerate(order) if request >= 0}
        timing.slots = [slot_of[i] for i in range(len(rows))]
        timing.prefill_s = time.perf_counter() - began
        timing.prefill_tokens = sum(len(ids[s]) - starts[s] for s in timing.slots)
        timing.prefill_positions = plan.group_tokens if groups else plan.joint_tokens
        timing.prefill_groups = max(1, len(groups))
        timing.cached_tokens = sum(starts[s] for s in timing.slots)
        timing.starts = [starts[s] for s in timing.slots]
        timing.tiers = [tiers[s] for s in timing.slots]
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
        return [
            tokens[slot][: r.max_new_tokens].tolist()
            for slot, r in zip(timing.slots, rows, strict=True)
        ], timing

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
                tokens[slot][: max(0, min(size, r.max_new_tokens - done))].tolist()
                for slot, r in zip(timing.slots, rows, strict=True)
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
            if self.split_prefill:
                decode.compile_row_moves(self.cfg, self.buckets, self.mesh)
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
