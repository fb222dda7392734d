"""A small decoder-only transformer byte-level language model (Flax linen + Optax AdamW).

Pure functions over immutable state: :func:`init_state`, :func:`loss_fn`, :func:`train_step`,
and the model itself (:class:`DecoderLM`, rotary positions, an optional KV cache); generation
lives in :mod:`workloads.serving.engine.decode`. Nothing here knows whether it runs on TPU or on CPU devices; the caller chooses
the mesh. ``import jax`` at module level is fine: this module is imported only inside workers and
Serve replicas, never by the driver.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from raytpu.errors import invalid

VOCAB = 256
"""Byte-level: every UTF-8 byte is a token."""
ROPE_BASE = 10_000.0


@dataclass(frozen=True)
class ModelConfig:
    """Model and optimizer hyper-parameters; saved with every checkpoint."""

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 384
    seq_len: int = 64
    """Training window (tokens per example)."""
    context_len: int = 1024
    """Serving context: prompt plus new tokens, the KV cache's length. Rotary positions are not
    learned, so a model trained on ``seq_len`` windows serves any context up to this bound."""
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


KVCache = tuple[tuple[jax.Array, jax.Array], ...]
"""Per layer ``(keys, values)``, each ``[batch, context_len, n_heads, head_dim]``."""


def rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary position embedding of ``x`` ``[B, T, H, D]`` at integer ``positions`` ``[B, T]``:
    a token's keys and queries depend on its absolute position only, so cached keys never shift."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (ROPE_BASE ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = positions[..., None].astype(jnp.float32) * freqs  # [B, T, half]
    sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
    first, second = x[..., :half], x[..., half:]
    return jnp.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


class Attention(nn.Module):
    """Causal multi-head self-attention with RoPE. Without a cache: over ``x`` itself (training).
    With a cache: ``x``'s keys/values are written at ``positions`` (beyond ``context_len``:
    dropped), and each query attends to every cached position up to its own."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: tuple[jax.Array, jax.Array] | None
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        cfg = self.config
        heads, dim = cfg.n_heads, cfg.d_model // cfg.n_heads
        q = rope(nn.DenseGeneral((heads, dim), name="query")(x), positions)
        k = rope(nn.DenseGeneral((heads, dim), name="key")(x), positions)
        v = nn.DenseGeneral((heads, dim), name="value")(x)
        if cache is None:
            keys, values, key_positions = k, v, positions
        else:
            rows = jnp.arange(x.shape[0])[:, None]
            keys = cache[0].at[rows, positions].set(k, mode="drop")
            values = cache[1].at[rows, positions].set(v, mode="drop")
            cache = (keys, values)
            key_positions = jnp.arange(keys.shape[1])[None, :]
        visible = key_positions[:, None, :] <= positions[:, :, None]  # [B, T, S]
        scores = jnp.einsum("bthd,bshd->bhts", q, keys) / jnp.sqrt(jnp.float32(dim))
        scores = jnp.where(visible[:, None], scores, jnp.finfo(scores.dtype).min)
        out = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, axis=-1), values)
        return nn.DenseGeneral(cfg.d_model, axis=(-2, -1), name="out")(out), cache


class Block(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(
        self, x: jax.Array, positions: jax.Array, cache: tuple[jax.Array, jax.Array] | None
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        cfg = self.config
        h, cache = Attention(cfg)(nn.LayerNorm()(x), positions, cache)
        x = x + h
        h = nn.LayerNorm()(x)
        h = nn.Dense(cfg.d_ff)(h)
        h = nn.gelu(h)
        h = nn.Dense(cfg.d_model)(h)
        return x + h, cache


class DecoderLM(nn.Module):
    """Token embeddings, ``n_layers`` causal pre-LN blocks with rotary positions, output head.

    ``positions`` default to ``0..T-1``; with a ``kv`` cache (:func:`empty_cache`) the call
    writes this chunk's keys/values and returns the updated cache (prefill and decode)."""

    config: ModelConfig

    @nn.compact
    def __call__(
        self, tokens: jax.Array, positions: jax.Array | None = None, kv: KVCache | None = None
    ) -> tuple[jax.Array, KVCache | None]:
        cfg = self.config
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[-1]), tokens.shape)
        x = nn.Embed(VOCAB, cfg.d_model)(tokens)
        caches = []
        for layer in range(cfg.n_layers):
            x, cache = Block(cfg)(x, positions, None if kv is None else kv[layer])
            caches.append(cache)
        x = nn.LayerNorm()(x)
        return nn.Dense(VOCAB)(x), None if kv is None else tuple(caches)


def empty_cache(cfg: ModelConfig, rows: int) -> KVCache:
    """A zeroed KV cache for ``rows`` sequences of up to ``cfg.context_len`` tokens."""
    shape = (rows, cfg.context_len, cfg.n_heads, cfg.d_model // cfg.n_heads)
    return tuple((jnp.zeros(shape), jnp.zeros(shape)) for _ in range(cfg.n_layers))


@struct.dataclass
class TrainState:
    """Immutable training state: a new one comes out of every :func:`train_step`."""

    step: jax.Array
    params: Any
    opt_state: Any


def optimizer(cfg: ModelConfig) -> optax.GradientTransformation:
    schedule = optax.linear_schedule(0.0, cfg.learning_rate, max(1, cfg.warmup_steps))
    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, weight_decay=cfg.weight_decay),
    )


def init_state(cfg: ModelConfig, rng: jax.Array) -> TrainState:
    params = DecoderLM(cfg).init(rng, jnp.zeros((1, cfg.seq_len), jnp.int32))["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer(cfg).init(params)
    )


def loss_fn(params: Any, cfg: ModelConfig, batch: jax.Array) -> jax.Array:
    """Mean next-byte cross entropy; ``batch`` is ``[B, seq_len + 1]`` int32 bytes."""
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits, _ = DecoderLM(cfg).apply({"params": params}, inputs)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def train_step(
    cfg: ModelConfig, state: TrainState, batch: jax.Array
) -> tuple[TrainState, jax.Array]:
    """One AdamW step. Under ``jit`` with a batch sharded over the mesh, XLA all-reduces grads."""
    loss, grads = jax.value_and_grad(loss_fn)(state.params, cfg, batch)
    updates, opt_state = optimizer(cfg).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss


def logits_fn(params: Any, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Logits of every position of ``tokens`` (no cache: causal over the tokens themselves)."""
    return DecoderLM(cfg).apply({"params": params}, tokens)[0]


def sample_batch(
    corpus: np.ndarray, batch_size: int, seq_len: int, seed: int | tuple[int, ...]
) -> np.ndarray:
    """``[batch_size, seq_len + 1]`` random windows of the corpus; deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(corpus) - seq_len - 1, size=batch_size)
    return np.stack([corpus[s : s + seq_len + 1] for s in starts]).astype(np.int32)


def encode(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)


def decode(tokens: Any) -> str:
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def local_mesh() -> jax.sharding.Mesh:
    """A 1-D mesh (axis ``data``) over this process's devices: every chip of one TPU host."""
    return jax.sharding.Mesh(np.array(jax.local_devices()), ("data",))


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def place_batch(rows: np.ndarray, mesh: jax.sharding.Mesh | None) -> jax.Array:
    """``rows`` on the devices: split along the batch over the mesh's ``data`` axis (the row
    count must be a multiple of its size), or on the default device without a mesh."""
    if mesh is None:
        return jnp.asarray(rows)
    if rows.shape[0] % mesh.size:
        raise ValueError(
            invalid(
                "batch rows", rows.shape[0], f"a multiple of the {mesh.size} devices of the mesh"
            )
        )
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    return jax.device_put(rows, sharding)


def params_digest(params: Any) -> str:
    """SHA-256 over every parameter's global value, whatever the mesh: a replicated array's first
    shard, a sharded one gathered (over every process when it spans hosts: a collective, so every
    process calls this). The same parameters give the same digest on any mesh."""
    from workloads.model.sharding import host_value

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.asarray(host_value(leaf)).tobytes())
    return digest.hexdigest()
