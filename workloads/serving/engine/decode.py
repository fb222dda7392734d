"""Generation with a KV cache: prefill once, then decode inside one compiled loop on the device.

Glossary:

- **decoder**: the model decoded (:mod:`workloads.serving.engine.decoders`: the byte LM, a Llama
  preset or Hugging Face folder). Every function here takes one as ``cfg``, or a byte LM
  :class:`workloads.model.byte_lm.ModelConfig`.
- **KV cache**: per layer the keys and values of every position so far, ``[rows, context_len,
  heads, head_dim]`` (the decoder's ``empty_cache``). Positions are rotary and absolute, so a
  cached key never changes when more tokens arrive.
- **prefill**: every prompt token of a batch in one forward call (rows right-padded to a length
  bucket, :func:`length_bucket`) that writes the cache and returns each row's next-token logits.
  A row may start at ``start > 0`` when its first ``start`` positions are already in the cache
  (a prefix-cache hit, :mod:`workloads.serving.engine.prefix_cache`).
- **decode**: a ``lax.while_loop`` that samples a token, feeds it at its position and repeats,
  ``steps`` times; the tokens stay on the device until the loop returns (one transfer per call,
  not per token). It can be resumed (:class:`DecodeState`) to stream chunks of tokens.

Each decode step attends over the whole ``context_len`` cache with a mask, so its cost does not
grow with the prompt: per-token cost is flat in context. Sampling: each row has its own key
``k = PRNGKey(row seed)``; per new token ``k, sub = split(k)`` and temperature 0 is greedy. So a
row's tokens depend on its prompt, temperature and seed only, never on the other rows of its
batch or its slot (the same in :func:`generate_tokens_uncached`, the cache-free reference the
tests compare with). :func:`row_seeds` gives rows without a seed of their own one each.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from raytpu.errors import invalid
from workloads.model import byte_lm as m
from workloads.serving.engine.decoders import as_decoder
from workloads.serving.engine.prefill_plan import FILLER, PrefillGroup
from workloads.serving.requests import MAX_SEED

MIN_BUCKET = 16
"""Shortest prefill length: shorter prompts are padded to it (one compile covers them)."""
_REPLICATED = jax.sharding.PartitionSpec()


def length_bucket(length: int, limit: int) -> int:
    """The prefill length for ``length`` tokens: the next power of two >= MIN_BUCKET, at most
    ``limit``."""
    if not 1 <= length <= limit:
        raise ValueError(invalid("prompt tokens", length, f"1..{limit}"))
    bucket = MIN_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, limit)


def prompt_ids(cfg: Any, prompt: str | Sequence[int], max_new_tokens: int) -> np.ndarray:
    """The prompt's tokens (``prompt`` as text, or its token ids) that fit the context with
    ``max_new_tokens`` after them (the last ``context_len - max_new_tokens``); an empty prompt
    reads as the decoder's pad token."""
    dec = as_decoder(cfg)
    room = dec.context_len - max_new_tokens
    if max_new_tokens < 1 or room < 1:
        valid = f"1..{dec.context_len - 1} (context_len {dec.context_len})"
        raise ValueError(invalid("max_new_tokens", max_new_tokens, valid))
    tokens = dec.encode(prompt) if isinstance(prompt, str) else np.asarray(prompt, np.int32)
    ids = tokens[-room:]
    return ids if len(ids) else np.array([dec.pad_token], np.int32)


def row_seeds(seed: int, rows: int) -> tuple[int, ...]:
    """A seed per row from a batch's ``seed`` (row ``i``'s is the same in every batch of that
    seed): for rows that bring no seed of their own."""
    return tuple((seed * 1_000_003 + i) % MAX_SEED for i in range(rows))


def row_keys(seeds: Sequence[int]) -> np.ndarray:
    """``[rows, 2]`` sampling keys, ``PRNGKey(seed)`` of each row."""
    return np.asarray(jax.vmap(jax.random.PRNGKey)(jnp.asarray(seeds, jnp.int32)))


@dataclass
class DecodeState:
    """A batch between decode calls, on the device: its cache, the logits of each row's next
    token, the position that token will take, and each row's sampling key."""

    kv: m.KVCache
    logits: jax.Array
    positions: jax.Array
    temperatures: jax.Array
    keys: jax.Array
    mesh: jax.sharding.Mesh | None = None


def _split_rows(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each row's key split: (the keys to carry on, this step's keys)."""
    both = jax.vmap(jax.random.split)(keys)
    return both[:, 0], both[:, 1]


@jax.jit
def pick(logits: jax.Array, temps: jax.Array, keys: jax.Array) -> jax.Array:
    """One token per row: argmax at temperature 0, else a sample at that temperature with the
    row's own key."""
    greedy = jnp.argmax(logits, axis=-1)
    scaled = logits / jnp.maximum(temps, 1e-6)[:, None]
    sampled = jax.vmap(jax.random.categorical)(keys, scaled)
    return jnp.where(temps > 0, sampled, greedy).astype(jnp.int32)


def _compiled(cfg: Any, mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
    """:func:`_programs` of ``cfg``'s decoder."""
    return _programs(as_decoder(cfg), mesh)


@functools.cache
def _programs(dec: Any, mesh: jax.sharding.Mesh | None = None) -> dict[str, Any]:
    """The jitted programs for ``cfg``. With a ``mesh``, prefill and decode run per device on its
    own rows (``shard_map`` over the ``data`` axis, parameters replicated): no collective at all,
    where the partitioner would all-gather the cache for its scatter."""
    rows, same = jax.sharding.PartitionSpec("data"), jax.sharding.PartitionSpec()

    def prefill(params, kv, tokens, starts, lengths):
        positions = starts[:, None] + jnp.arange(tokens.shape[1])[None, :]
        logits, kv = dec.apply(params, tokens, positions, kv)
        last = (lengths - 1 - starts)[:, None, None]
        return jnp.take_along_axis(logits, last, axis=1)[:, 0], kv

    def decode(params, kv, logits, positions, temps, keys, steps, cap):
        out = jnp.zeros((logits.shape[0], cap), jnp.int32)

        def body(carry):
            i, kv, logits, positions, keys, out = carry
            keys, subs = _split_rows(keys)
            token = pick(logits, temps, subs)
            out = out.at[:, i].set(token)
            logits, kv = dec.apply(params, token[:, None], positions[:, None], kv)
            return i + 1, kv, logits[:, 0], positions + 1, keys, out

        carry = (jnp.int32(0), kv, logits, positions, keys, out)
        _, kv, logits, positions, keys, out = jax.lax.while_loop(
            lambda c: c[0] < steps, body, carry
        )
        return out, kv, logits, positions, keys

    def per_device(fn, in_specs, out_specs):
        if mesh is None:
            return fn
        return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)

    def decode_sharded(params, kv, logits, positions, temps, keys, steps, cap):
        fn = per_device(
            functools.partial(decode, cap=cap),
            (same, rows, rows, rows, rows, rows, same),
            (rows, rows, rows, rows, rows),
        )
        return fn(params, kv, logits, positions, temps, keys, steps)

    def read_block(kv, row, start, size):
        return jnp.stack(
            [
                jnp.stack([jax.lax.dynamic_slice_in_dim(t[row], start, size) for t in layer])
                for layer in kv
            ]
        )

    def write_block(kv, block, row, start):
        return tuple(
            tuple(
                jax.lax.dynamic_update_slice(
                    t, block[layer, i][None].astype(t.dtype), (row, start, 0, 0)
                )
                for i, t in enumerate(pair)
            )
            for layer, pair in enumerate(kv)
        )

    def take_rows(kv, local):
        return jax.tree.map(lambda t: jnp.take(t, local, axis=0, mode="fill", fill_value=0), kv)

    def put_rows(full, part, local):
        return jax.tree.map(
            lambda t, p: t.at[local].set(p.astype(t.dtype), mode="drop"), full, part
        )

    return {
        "take_rows": jax.jit(per_device(take_rows, (rows, rows), rows)),
        "put_rows": jax.jit(per_device(put_rows, (rows, rows, rows), rows), donate_argnums=0),
        "prefill": jax.jit(
            per_device(prefill, (same, rows, rows, rows, rows), (rows, rows)), donate_argnums=1
        ),
        "decode": jax.jit(decode_sharded, donate_argnums=1, static_argnames=("cap",)),
        "read_block": jax.jit(read_block, static_argnames=("size",)),
        "write_block": jax.jit(write_block, donate_argnums=0),
        "forward": jax.jit(dec.forward),
    }


def new_cache(cfg: Any, rows: int, mesh: jax.sharding.Mesh | None) -> m.KVCache:
    """An empty cache for ``rows`` rows, split over the mesh's ``data`` axis like the batch."""
    dec = as_decoder(cfg)
    if mesh is None:
        return dec.empty_cache(rows)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    return jax.jit(lambda: dec.empty_cache(rows), out_shardings=sharding)()


def read_block(cfg: Any, kv: m.KVCache, row: int, start: int, size: int) -> jax.Array:
    """Positions ``start..start+size`` of one row: ``[layers, 2 (k, v), size, heads, dim]``,
    read on the one device that holds the row (no collective)."""
    first = kv[0][0]
    if len(first.sharding.device_set) > 1:
        (index,) = [
            i for i, s in enumerate(first.addressable_shards) if _holds(s.index[0], row, first)
        ]
        row -= first.addressable_shards[index].index[0].start or 0
        kv = jax.tree.map(lambda leaf: leaf.addressable_shards[index].data, kv)
    return _compiled(cfg)["read_block"](kv, row, start, size=size)


def _holds(rows: slice, row: int, leaf: jax.Array) -> bool:
    start, stop, _ = rows.indices(leaf.shape[0])
    return start <= row < stop


def write_block(cfg: Any, kv: m.KVCache, block: Any, row: int, start: int) -> m.KVCache:
    """``kv`` with :func:`read_block`'s ``block`` written back at ``row``, ``start`` (``kv`` is
    donated: use the returned cache)."""
    sharding = kv[0][0].sharding
    if len(sharding.device_set) > 1:  # a block from another device, the host or another replica
        block = jax.device_put(block, jax.sharding.NamedSharding(sharding.mesh, _REPLICATED))
    return _compiled(cfg)["write_block"](kv, block, row, start)


@dataclass(frozen=True)
class PrefillInputs:
    """What a batch's prefill takes, one entry per row: its prompt tokens, where its prefill
    starts (the tokens before are in the cache already: a prefix-cache hit), its sampling
    temperature and its sampling seed."""

    ids: tuple[np.ndarray, ...]
    starts: tuple[int, ...]
    temperatures: tuple[float, ...]
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        rows = len(self.ids)
        for name in ("starts", "temperatures", "seeds"):
            if len(getattr(self, name)) != rows:
                raise ValueError(invalid(name, getattr(self, name), f"{rows} entries, one per row"))
        lengths = [len(row) for row in self.ids]
        if any(not 0 <= s < n for s, n in zip(self.starts, lengths, strict=True)):
            raise ValueError(invalid("starts", self.starts, "0 <= start < prompt length"))

    @classmethod
    def fresh(cls, ids: Sequence[np.ndarray], temperatures: Sequence[float], seed: int = 0):
        """Every row prefilled from its first token (no cache hit), seeds from ``seed``."""
        return cls(tuple(ids), (0,) * len(ids), tuple(temperatures), row_seeds(seed, len(ids)))


def prefill(
    params: Any,
    cfg: Any,
    kv: m.KVCache,
    inputs: PrefillInputs,
    mesh: jax.sharding.Mesh | None = None,
    groups: Sequence[PrefillGroup] = (),
) -> DecodeState:
    """Run each row's prompt tokens from its start on (earlier positions must already be in
    ``kv``; ``kv`` is donated) and return the state to decode from: in one program padded to
    the longest row, or with ``groups`` one width group at a time (:func:`_by_width`)."""
    cfg, ids = as_decoder(cfg), list(inputs.ids)
    lengths = np.array([len(row) for row in ids], np.int32)
    begin = np.array(inputs.starts, np.int32)
    place = functools.partial(m.place_batch, mesh=mesh)
    if groups:
        logits, kv = _by_width(params, cfg, mesh, kv, ids, begin, groups)
    else:
        logits, kv = _joint(params, cfg, mesh, kv, ids, begin)
    temps = place(np.asarray(inputs.temperatures, np.float32))
    keys = place(row_keys(inputs.seeds))
    return DecodeState(kv, logits, place(lengths), temps, keys, mesh)


def _joint(params: Any, cfg: Any, mesh: Any, kv: m.KVCache, ids: list, begin: Any):
    """Every row in one prefill program, right-padded to the longest row's length bucket."""
    lengths = np.array([len(row) for row in ids], np.int32)
    width = length_bucket(int((lengths - begin).max()), cfg.context_len)
    tokens = np.full((len(ids), width), cfg.pad_token, np.int32)
    for row, (seq, start) in enumerate(zip(ids, begin, strict=True)):
        tokens[row, : len(seq) - start] = seq[start:]
    place = functools.partial(m.place_batch, mesh=mesh)
    return _compiled(cfg, mesh)["prefill"](params, kv, place(tokens), place(begin), place(lengths))


def _by_width(
    params: Any,
    cfg: Any,
    mesh: Any,
    kv: m.KVCache,
    ids: list,
    begin: Any,
    groups: Sequence[PrefillGroup],
):
    """One width group at a time (:mod:`workloads.serving.engine.prefill_plan`): each group's rows are taken
    from ``kv`` (with their prefix-cache blocks) on their own device, prefilled jointly at the
    group's width, and put back with their logits. Slots in no group keep an empty row and zero
    logits (they hold no request)."""
    per = len(ids) // (mesh.size if mesh is not None else 1)
    place = functools.partial(m.place_batch, mesh=mesh)
    fns = _compiled(cfg, mesh)
    logits = place(np.zeros((len(ids), cfg.vocab), np.float32))
    filler = np.array([cfg.pad_token], np.int32)
    for group in groups:
        local = place(np.asarray(group.local_rows(per), np.int32))
        sub_ids = [filler if s == FILLER else ids[s] for s in group.slots]
        sub_begin = np.array([0 if s == FILLER else begin[s] for s in group.slots], np.int32)
        got, sub_kv = _joint(params, cfg, mesh, fns["take_rows"](kv, local), sub_ids, sub_begin)
        kv, logits = fns["put_rows"]((kv, logits), (sub_kv, got), local)
    return logits, kv


def compile_row_moves(cfg: Any, sizes: Sequence[int], mesh: Any = None) -> None:
    """Compile :func:`_by_width`'s takes and puts for every batch size in ``sizes`` and every
    sub-batch size up to it (a replica does this when it starts, not on a request)."""
    cfg, devices = as_decoder(cfg), mesh.size if mesh is not None else 1
    place = functools.partial(m.place_batch, mesh=mesh)
    fns = _compiled(cfg, mesh)
    for size in sizes:
        kv = new_cache(cfg, size, mesh)
        logits = place(np.zeros((size, cfg.vocab), np.float32))
        for sub in (s for s in sizes if s <= size):
            local = place(np.full(sub, size // devices, np.int32))  # every row a filler
            part = (fns["take_rows"](kv, local), place(np.zeros((sub, cfg.vocab), np.float32)))
            kv, logits = fns["put_rows"]((kv, logits), part, local)
        jax.block_until_ready(kv)


def decode(
    params: Any, cfg: Any, state: DecodeState, steps: int, cap: int | None = None
) -> tuple[np.ndarray, DecodeState]:
    """``steps`` new tokens per row (``[rows, steps]``, on the host) and the state to resume
    from. ``cap`` (>= steps, default: the next power of two) is the compiled output width."""
    cap = cap or length_bucket(steps, max(steps, MIN_BUCKET) * 2)
    if not 1 <= steps <= cap:
        raise ValueError(invalid("steps", steps, f"1..{cap}"))
    out, kv, logits, positions, keys = _compiled(cfg, state.mesh)["decode"](
        params,
        state.kv,
        state.logits,
        state.positions,
        state.temperatures,
        state.keys,
        jnp.int32(steps),
        cap=cap,
    )
    after = DecodeState(kv, logits, positions, state.temperatures, keys, state.mesh)
    return np.asarray(out)[:, :steps], after


def generate_tokens(
    params: Any,
    cfg: Any,
    prompts: list[str],
    max_new_tokens: list[int],
    temperatures: list[float],
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
) -> list[list[int]]:
    """New bytes for each prompt: one prefill and one decode loop for the whole batch.

    With a ``mesh`` the rows are split over its devices (:func:`workloads.model.byte_lm.place_batch`:
    the row count must be a multiple of its size); ``params`` should then be replicated on it.
    """
    if not prompts:
        return []
    ids = [prompt_ids(cfg, p, n) for p, n in zip(prompts, max_new_tokens, strict=True)]
    kv = new_cache(cfg, len(prompts), mesh)
    state = prefill(params, cfg, kv, PrefillInputs.fresh(ids, temperatures, seed), mesh)
    tokens, _ = decode(params, cfg, state, max(max_new_tokens))
    return [row[:n].tolist() for row, n in zip(tokens, max_new_tokens, strict=True)]


def generate(
    params: Any,
    cfg: Any,
    prompts: list[str],
    max_new_tokens: list[int],
    temperatures: list[float],
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
) -> list[str]:
    """Continue each prompt (:func:`generate_tokens`) and decode the new tokens as text."""
    tokens = generate_tokens(params, cfg, prompts, max_new_tokens, temperatures, seed, mesh)
    return [as_decoder(cfg).decode(row) for row in tokens]


def generate_tokens_uncached(
    params: Any,
    cfg: Any,
    prompts: list[str] | list[Sequence[int]],
    max_new_tokens: list[int],
    temperatures: list[float],
    seed: int = 0,
) -> list[list[int]]:
    """The reference without a cache: every new token re-runs the whole sequence (causal, so
    right-padding after it changes nothing). Slow; for tests and benchmarks."""
    cfg = as_decoder(cfg)
    ids = [prompt_ids(cfg, p, n) for p, n in zip(prompts, max_new_tokens, strict=True)]
    steps = max(max_new_tokens)
    lengths = np.array([len(row) for row in ids])
    buffer = np.full((len(ids), int(lengths.max()) + steps), cfg.pad_token, np.int32)
    for row, seq in enumerate(ids):
        buffer[row, : len(seq)] = seq
    forward = _compiled(cfg)["forward"]
    temps = jnp.asarray(temperatures, jnp.float32)
    keys = jnp.asarray(row_keys(row_seeds(seed, len(ids))))
    rows = np.arange(len(ids))
    for _ in range(steps):
        logits = forward(params, jnp.asarray(buffer))[rows, lengths - 1]
        keys, subs = _split_rows(keys)
        buffer[rows, lengths] = np.asarray(pick(logits, temps, subs))
        lengths = lengths + 1
    starts = [len(seq) for seq in ids]
    return [
        buffer[row, s : s + n].tolist()
        for row, (s, n) in enumerate(zip(starts, max_new_tokens, strict=True))
    ]
