"""The Llama-style decoder for :mod:`raytpu.presets` (Flax linen + Optax AdamW).

RMSNorm, rotary position embeddings, SwiGLU and grouped-query attention, with every parameter
annotated with *logical* axes (MaxText's names: ``vocab``, ``embed``, ``heads``, ``kv_heads``,
``head_dim``, ``mlp``) that :mod:`workloads.model.sharding` maps onto the mesh. Parameters are fp32
(the master weights the optimizer updates); matmuls run in the preset's ``dtype`` (bf16 by default,
fp32 for parity with a reference); norms, softmax and the loss in fp32. Pure functions over immutable state, as :mod:`workloads.model.byte_lm` (the byte model,
still the demo default): :func:`init_state`, :func:`loss_fn`, :func:`train_step`.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from raytpu.presets import Preset

PARAM_DTYPE = jnp.float32


def compute_dtype(preset: Preset) -> Any:
    """The preset's matmul dtype (``Preset.dtype``: bfloat16 by default)."""
    return jnp.dtype(preset.dtype)


def _init(axes: tuple[str, ...], scale: float = 0.02) -> Any:
    return nn.with_logical_partitioning(nn.initializers.normal(scale), axes)


class RMSNorm(nn.Module):
    eps: float = 1e-5
    dtype: Any = jnp.bfloat16

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param(
            "scale",
            nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
            (x.shape[-1],),
            PARAM_DTYPE,
        )
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * scale).astype(self.dtype)


def norm(preset: Preset, name: str) -> RMSNorm:
    return RMSNorm(eps=preset.rms_norm_eps, dtype=compute_dtype(preset), name=name)


def rope(x: jax.Array, theta: float, positions: jax.Array) -> jax.Array:
    """Rotary position embedding over ``[batch, seq, heads, head_dim]`` (half-split pairs) at
    integer ``positions`` ``[batch, seq]``: a key depends on its absolute position only, so a
    cached key never changes when more tokens arrive."""
    dim = x.shape[-1]
    freqs = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = positions[..., None].astype(jnp.float32) * freqs  # [batch, seq, dim / 2]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


KVCache = tuple[tuple[jax.Array, jax.Array], ...]
"""Per layer ``(keys, values)``, each ``[rows, context_len, n_kv_heads, head_dim]`` in the
compute dtype (:func:`empty_cache`): grouped-query attention caches the key/value heads only."""


class Attention(nn.Module):
    """Causal grouped-query attention with RoPE. Without a cache: over ``x`` itself (training).
    With one: ``x``'s keys/values are written at ``positions`` (beyond the cache: dropped) and
    each query attends to every cached position up to its own (prefill and decode)."""

    preset: Preset

    @nn.compact
    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: tuple[jax.Array, jax.Array] | None
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        p = self.preset

        def proj(name: str, heads: int, axis: str) -> jax.Array:
            return nn.DenseGeneral(
                (heads, p.head_dim),
                use_bias=False,
                dtype=compute_dtype(p),
                param_dtype=PARAM_DTYPE,
                kernel_init=_init(("embed", axis, "head_dim")),
                name=name,
            )(x)

        q = rope(proj("q", p.n_heads, "heads"), p.rope_theta, positions)
        k = rope(proj("k", p.n_kv_heads, "kv_heads"), p.rope_theta, positions)
        v = proj("v", p.n_kv_heads, "kv_heads")
        if cache is None:
            key_positions = positions
        else:
            rows = jnp.arange(x.shape[0])[:, None]
            k = cache[0].at[rows, positions].set(k.astype(cache[0].dtype), mode="drop")
            v = cache[1].at[rows, positions].set(v.astype(cache[1].dtype), mode="drop")
            cache, key_positions = (k, v), jnp.arange(k.shape[1])[None, :]
        groups = p.n_heads // p.n_kv_heads
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(p.head_dim)
        visible = key_positions[:, None, :] <= positions[:, :, None]  # [batch, query, key]
        scores = jnp.where(visible[:, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(compute_dtype(p))
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return nn.DenseGeneral(
            p.d_model,
            axis=(-2, -1),
            use_bias=False,
            dtype=compute_dtype(p),
            param_dtype=PARAM_DTYPE,
            kernel_init=_init(("heads", "head_dim", "embed")),
            name="o",
        )(out), cache


class SwiGLU(nn.Module):
    preset: Preset

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        def dense(name: str, features: int, axes: tuple[str, str], h: jax.Array) -> jax.Array:
            return nn.Dense(
                features,
                use_bias=False,
                dtype=compute_dtype(self.preset),
                param_dtype=PARAM_DTYPE,
                kernel_init=_init(axes),
                name=name,
            )(h)

        gate = dense("gate", self.preset.d_ff, ("embed", "mlp"), x)
        up = dense("up", self.preset.d_ff, ("embed", "mlp"), x)
        return dense("down", self.preset.d_model, ("mlp", "embed"), nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    preset: Preset

    @nn.compact
    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: tuple[jax.Array, jax.Array] | None
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        p = self.preset
        h, cache = Attention(p, name="attention")(norm(p, "attention_norm")(x), positions, cache)
        x = x + h
        return x + SwiGLU(p, name="mlp")(norm(p, "mlp_norm")(x)), cache


class LlamaLM(nn.Module):
    """Token embedding, ``n_layers`` decoder layers, final RMSNorm, output head (tied or not):
    fp32 logits and the cache. ``positions`` default to ``0..T-1``; with a ``kv`` cache
    (:func:`empty_cache`) the call writes this chunk's keys/values and returns the updated
    cache (the serving engine's prefill and decode), else ``None``."""

    preset: Preset

    @nn.compact
    def __call__(
        self, tokens: jax.Array, positions: jax.Array | None = None, kv: KVCache | None = None
    ) -> tuple[jax.Array, KVCache | None]:
        p = self.preset
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)
        embed = nn.Embed(
            p.vocab_size,
            p.d_model,
            dtype=compute_dtype(p),
            param_dtype=PARAM_DTYPE,
            embedding_init=_init(("vocab", "embed"), 1.0),
            name="embed",
        )
        x, caches = embed(tokens), []
        for index in range(p.n_layers):
            layer = DecoderLayer(p, name=f"layer_{index}")
            x, cache = layer(x, positions, None if kv is None else kv[index])
            caches.append(cache)
        x = norm(p, "final_norm")(x)
        if p.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = nn.Dense(
                p.vocab_size,
                use_bias=False,
                dtype=compute_dtype(p),
                param_dtype=PARAM_DTYPE,
                kernel_init=_init(("embed", "vocab")),
                name="head",
            )(x)
        return logits.astype(jnp.float32), None if kv is None else tuple(caches)


def empty_cache(preset: Preset, rows: int, context_len: int) -> KVCache:
    """A zeroed KV cache for ``rows`` sequences of up to ``context_len`` tokens."""
    shape = (rows, context_len, preset.n_kv_heads, preset.head_dim)
    dtype = compute_dtype(preset)
    return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(preset.n_layers))


@struct.dataclass
class TrainState:
    """Immutable training state. From :func:`init_state` the params and optimizer moments carry
    their logical-axis boxes (``nn.LogicallyPartitioned``), which
    :func:`workloads.model.sharding.state_shardings` reads; training runs on the unboxed arrays."""

    step: jax.Array
    params: Any
    opt_state: Any


def optimizer(learning_rate: float = 3e-3, warmup_steps: int = 2) -> optax.GradientTransformation:
    schedule = optax.linear_schedule(0.0, learning_rate, max(1, warmup_steps))
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def init_state(preset: Preset, rng: jax.Array) -> TrainState:
    params = LlamaLM(preset).init(rng, jnp.zeros((1, preset.seq_len), jnp.int32))["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer().init(params)
    )


def loss_fn(params: Any, preset: Preset, batch: jax.Array) -> jax.Array:
    """Mean next-token cross entropy (fp32); ``batch`` is ``[B, seq_len + 1]`` token ids."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits, _ = LlamaLM(preset).apply({"params": params}, inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def train_step(preset: Preset, state: TrainState, batch: jax.Array) -> tuple[TrainState, jax.Array]:
    """One AdamW step on the fp32 master weights; the forward and backward run in bf16."""
    loss, grads = jax.value_and_grad(loss_fn)(state.params, preset, batch)
    updates, opt_state = optimizer().update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss
