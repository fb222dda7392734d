"""A small decoder-only transformer byte-level language model (Flax linen + Optax AdamW).

Pure functions over immutable state: :func:`init_state`, :func:`loss_fn`, :func:`train_step`,
:func:`generate`. Nothing here knows whether it runs on TPU or on CPU devices; the caller chooses
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

VOCAB = 256
"""Byte-level: every UTF-8 byte is a token."""


@dataclass(frozen=True)
class ModelConfig:
    """Model and optimizer hyper-parameters; saved with every checkpoint."""

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 384
    seq_len: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 0.01
    warmup_steps: int = 10

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


class Block(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        cfg = self.config
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=cfg.n_heads, qkv_features=cfg.d_model)(
            h, h, mask=mask
        )
        x = x + h
        h = nn.LayerNorm()(x)
        h = nn.Dense(cfg.d_ff)(h)
        h = nn.gelu(h)
        h = nn.Dense(cfg.d_model)(h)
        return x + h


class DecoderLM(nn.Module):
    """Token + position embeddings, ``n_layers`` causal pre-LN blocks, tied-free output head."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.config
        length = tokens.shape[-1]
        x = nn.Embed(VOCAB, cfg.d_model)(tokens)
        pos = self.param("pos", nn.initializers.normal(0.02), (cfg.seq_len, cfg.d_model))
        x = x + pos[:length]
        mask = nn.make_causal_mask(tokens)
        for _ in range(cfg.n_layers):
            x = Block(cfg)(x, mask)
        x = nn.LayerNorm()(x)
        return nn.Dense(VOCAB)(x)


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
    logits = DecoderLM(cfg).apply({"params": params}, inputs)
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
    return DecoderLM(cfg).apply({"params": params}, tokens)


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


def generate(
    params: Any,
    cfg: ModelConfig,
    prompts: list[str],
    max_new_tokens: list[int],
    temperatures: list[float],
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
) -> list[str]:
    """Continue each prompt (see :func:`generate_tokens`) and decode the new bytes."""
    tokens = generate_tokens(params, cfg, prompts, max_new_tokens, temperatures, seed, mesh)
    return [decode(row) for row in tokens]


def local_mesh() -> jax.sharding.Mesh:
    """A 1-D mesh (axis ``data``) over this process's devices: every chip of one TPU host."""
    return jax.sharding.Mesh(np.array(jax.local_devices()), ("data",))


def replicated(mesh: jax.sharding.Mesh) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def prompt_windows(cfg: ModelConfig, prompts: list[str]) -> np.ndarray:
    """The last ``seq_len`` bytes of each prompt, left-padded with spaces: ``[rows, seq_len]``."""
    windows = np.full((len(prompts), cfg.seq_len), ord(" "), np.int32)
    for row, prompt in enumerate(prompts):
        ids = encode(prompt)[-cfg.seq_len :]
        windows[row, cfg.seq_len - len(ids) :] = ids
    return windows


def place_batch(rows: np.ndarray, mesh: jax.sharding.Mesh | None) -> jax.Array:
    """``rows`` on the devices: split along the batch over the mesh's ``data`` axis (the row
    count must be a multiple of its size), or on the default device without a mesh."""
    if mesh is None:
        return jnp.asarray(rows)
    if rows.shape[0] % mesh.size:
        raise ValueError(
            f"batch rows: {rows.shape[0]} is not valid; valid: a multiple of the {mesh.size} "
            "devices of the mesh"
        )
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    return jax.device_put(rows, sharding)


def next_logits(params: Any, cfg: ModelConfig, tokens: jax.Array) -> jax.Array:
    """Logits of the next byte for each row (jitted once per config)."""
    return _jitted_next_logits(cfg)(params, tokens)


def generate_tokens(
    params: Any,
    cfg: ModelConfig,
    prompts: list[str],
    max_new_tokens: list[int],
    temperatures: list[float],
    seed: int = 0,
    mesh: jax.sharding.Mesh | None = None,
) -> list[list[int]]:
    """New bytes for each prompt; a batch of prompts shares one jitted forward per new byte.

    Temperature 0 is greedy. Context is the last ``seq_len`` bytes, left-padded with spaces.
    With a ``mesh`` the rows are split over its devices (:func:`place_batch`); ``params`` should
    then be on the same mesh (replicated: :func:`replicated`).
    """
    steps = max(max_new_tokens) if max_new_tokens else 0
    temps = place_batch(np.asarray(temperatures, np.float32), mesh)
    tokens = place_batch(prompt_windows(cfg, prompts), mesh)
    key = jax.random.PRNGKey(seed)
    outputs: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        key, sub = jax.random.split(key)
        logits = next_logits(params, cfg, tokens)
        nxt = _pick(logits, temps, sub)
        tokens = jnp.concatenate([tokens[:, 1:], nxt[:, None]], axis=1)
        for row, tok in enumerate(np.asarray(nxt)):
            if len(outputs[row]) < max_new_tokens[row]:
                outputs[row].append(int(tok))
    return outputs


_FORWARD_CACHE: dict[ModelConfig, Any] = {}


def _jitted_next_logits(cfg: ModelConfig) -> Any:
    if cfg not in _FORWARD_CACHE:
        _FORWARD_CACHE[cfg] = jax.jit(lambda p, t: logits_fn(p, cfg, t)[:, -1, :])
    return _FORWARD_CACHE[cfg]


@jax.jit
def _pick(logits: jax.Array, temps: jax.Array, key: jax.Array) -> jax.Array:
    greedy = jnp.argmax(logits, axis=-1)
    scaled = logits / jnp.maximum(temps, 1e-6)[:, None]
    sampled = jax.random.categorical(key, scaled, axis=-1)
    return jnp.where(temps > 0, sampled, greedy).astype(jnp.int32)


def params_digest(params: Any) -> str:
    """SHA-256 over every parameter's bytes (first addressable shard: replicas are identical)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        data = leaf.addressable_data(0) if isinstance(leaf, jax.Array) else leaf
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.asarray(data).tobytes())
    return digest.hexdigest()
