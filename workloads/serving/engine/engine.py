"""The serving engine of one replica: batches of prompts through the prefix cache, one prefill,
and decode loops on the device (:mod:`workloads.serving.engine.decode`), padded to the replica's batch buckets.

:meth:`Engine.generate` returns whole completions; :meth:`Engine.stream` yields them in chunks of
``chunk`` tokens (each chunk one compiled decode loop), for server-sent events.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from raytpu.errors import invalid
from workloads.serving.engine import decode, prefill_plan
from workloads.serving.engine.decoders import as_decoder
from workloads.serving.engine.prefix_cache import LoadedPrefix, PrefixCache, PrefixHit

STREAM_CHUNK = 8
"""Tokens per decode loop when streaming (after the first token, which comes alone)."""


@dataclass(frozen=True)
class Row:
    """One request: its prompt as text or as token ids, how many new tokens, at what
    temperature, with what sampling seed."""

    prompt: str | tuple[int, ...]
    max_new_tokens: int
    temperature: float
    seed: int | None = None
    """The same prompt, temperature and seed give the same tokens in any batch and slot (the
    OpenAI API's ``seed``); None: one from the batch's seed and the row's place
    (:func:`workloads.serving.engine.decode.row_seeds`)."""


@dataclass(frozen=True)
class Timing:
    """Where a batch's time went (seconds) and what the prefix cache saved."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    first_token_s: float = 0.0
    hits: tuple[PrefixHit, ...] = ()
    """Per row: its prefix-cache hit (:class:`workloads.serving.engine.prefix_cache.PrefixHit`)."""
    slots: tuple[int, ...] = ()
    """Per row: its slot in the batch (:func:`workloads.serving.engine.prefill_plan.place`)."""
    prefill_positions: int = 0
    """Token positions the prefill computed, padding included (:mod:`workloads.serving.engine.prefill_plan`)."""
    prefill_groups: int = 1
    """Prefill programs run: 1 for a joint prefill, else one per width group."""


@dataclass(frozen=True)
class Prefilled:
    """A batch after its prefill: the state to decode from and the timing so far."""

    state: decode.DecodeState
    timing: Timing


@dataclass(frozen=True)
class StreamChunk:
    """New tokens per row from one decode loop, and the batch's timing up to it (the last
    chunk's has the decode time)."""

    tokens: list[list[int]]
    timing: Timing


@dataclass(frozen=True)
class _Arranged:
    """A batch in the slots :func:`prefill_plan.place` picked: ``order[slot]`` is the request
    index (or ``FILLER``), with each slot's row and prompt tokens."""

    order: tuple[int, ...]
    rows: tuple[Row, ...]
    ids: tuple[Any, ...]

    def slots(self, count: int) -> tuple[int, ...]:
        """The slot of each of the ``count`` requests."""
        slot_of = {request: slot for slot, request in enumerate(self.order) if request >= 0}
        return tuple(slot_of[i] for i in range(count))


PAD_ROW = Row(" ", 1, 0.0)


class Engine:
    """``params`` (replicated over ``mesh``) and their decoder ``cfg``
    (:mod:`workloads.serving.engine.decoders`, or a byte LM config); batches padded to
    ``buckets`` rows."""

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
        self.params, self.cfg, self.mesh = params, as_decoder(cfg), mesh
        self.buckets, self.prefix, self.cap = buckets, prefix, cap
        self.split_prefill = split_prefill
        """False: every batch prefills jointly, padded to its longest prompt (the benchmark's
        side-by-side)."""

    def _size(self, rows: list[Row]) -> int:
        if not 1 <= len(rows) <= self.buckets[-1]:
            raise ValueError(invalid("batch size", len(rows), f"1..{self.buckets[-1]}"))
        return next(b for b in self.buckets if b >= len(rows))

    def _arrange(self, rows: list[Row]) -> _Arranged:
        """The rows in their slots, by prompt length (before prefix-cache hits are known)."""
        cfg, size = self.cfg, self._size(rows)
        devices = self.mesh.size if self.mesh is not None else 1
        asked = [decode.prompt_ids(cfg, r.prompt, r.max_new_tokens) for r in rows]
        widths = [decode.length_bucket(len(i), cfg.context_len) for i in asked]
        order = prefill_plan.place(widths, size, devices)
        pad_ids = decode.prompt_ids(cfg, PAD_ROW.prompt, 1)
        return _Arranged(
            order=tuple(order),
            rows=tuple(PAD_ROW if i == prefill_plan.FILLER else rows[i] for i in order),
            ids=tuple(pad_ids if i == prefill_plan.FILLER else asked[i] for i in order),
        )

    def _load_prefix(self, arranged: _Arranged) -> LoadedPrefix:
        kv = decode.new_cache(self.cfg, len(arranged.order), self.mesh)
        if self.prefix is None:
            return LoadedPrefix(kv, tuple(PrefixHit() for _ in arranged.order))
        return self.prefix.load(kv, arranged.ids)

    def _prefill(self, rows: list[Row], seed: int) -> Prefilled:
        """The batch's prefill, its rows in the slots :meth:`_arrange` picks; the timing's
        ``slots`` map them back."""
        began = time.perf_counter()
        arranged = self._arrange(rows)
        loaded = self._load_prefix(arranged)
        derived = decode.row_seeds(seed, len(rows))
        seeds = [r.seed if r.seed is not None else d for r, d in zip(rows, derived, strict=True)]
        inputs = decode.PrefillInputs(
            arranged.ids,
            loaded.starts,
            tuple(r.temperature for r in arranged.rows),
            tuple(0 if i == prefill_plan.FILLER else seeds[i] for i in arranged.order),
        )
        devices = self.mesh.size if self.mesh is not None else 1
        plan = prefill_plan.plan_prefill(
            [
                decode.length_bucket(len(i) - s, self.cfg.context_len)
                for i, s in zip(inputs.ids, inputs.starts, strict=True)
            ],
            [i != prefill_plan.FILLER for i in arranged.order],
            devices,
            self.buckets,
        )
        groups = plan.groups if self.split_prefill else ()
        state = decode.prefill(self.params, self.cfg, loaded.kv, inputs, self.mesh, groups)
        if self.prefix is not None:  # an empty slot's one pad token makes no block
            self.prefix.store(state.kv, inputs.ids, inputs.starts)
        state.logits.block_until_ready()
        slots = arranged.slots(len(rows))
        timing = Timing(
            prefill_s=time.perf_counter() - began,
            prefill_tokens=sum(len(inputs.ids[s]) - inputs.starts[s] for s in slots),
            cached_tokens=sum(inputs.starts[s] for s in slots),
            hits=tuple(loaded.hits[s] for s in slots),
            slots=slots,
            prefill_positions=plan.group_tokens if groups else plan.joint_tokens,
            prefill_groups=max(1, len(groups)),
        )
        return Prefilled(state, timing)

    def generate(self, rows: list[Row], seed: int) -> tuple[list[list[int]], Timing]:
        """New tokens per row (each cut at its ``max_new_tokens``) and the batch's timing."""
        prefilled = self._prefill(rows, seed)
        began = time.perf_counter()
        steps = max(r.max_new_tokens for r in rows)
        tokens, _ = decode.decode(self.params, self.cfg, prefilled.state, steps, cap=self.cap)
        decode_s = time.perf_counter() - began
        timing = replace(
            prefilled.timing,
            decode_s=decode_s,
            first_token_s=prefilled.timing.prefill_s + decode_s / steps,
        )
        return [
            tokens[slot][: r.max_new_tokens].tolist()
            for slot, r in zip(timing.slots, rows, strict=True)
        ], timing

    def stream(
        self, rows: list[Row], seed: int, chunk: int = STREAM_CHUNK
    ) -> Iterator[StreamChunk]:
        """New tokens per row in chunks: the first token alone (the time to first token is
        prefill plus one step), then ``chunk`` at a time, each chunk one compiled decode loop.
        A row's list is empty once it has all it asked for."""
        prefilled = self._prefill(rows, seed)
        state, timing = prefilled.state, prefilled.timing
        steps = max(r.max_new_tokens for r in rows)
        done = 0
        began = time.perf_counter()
        while done < steps:
            size = min(1 if done == 0 else chunk, steps - done)
            tokens, state = decode.decode(self.params, self.cfg, state, size, cap=chunk)
            elapsed = time.perf_counter() - began
            if done == 0:
                timing = replace(timing, first_token_s=timing.prefill_s + elapsed)
            done += size
            if done >= steps:
                timing = replace(timing, decode_s=elapsed)
            yield StreamChunk(
                [
                    tokens[slot][: max(0, min(size, r.max_new_tokens - done + size))].tolist()
                    for slot, r in zip(timing.slots, rows, strict=True)
                ],
                timing,
            )

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
                    ids = (self.cfg.pad_token,) * min(length - 1, self.cfg.context_len - 1)
                    self.generate([Row(ids, 1, 0.0)] * size, seed=0)
                    length *= 2
        finally:
            self.prefix = prefix
