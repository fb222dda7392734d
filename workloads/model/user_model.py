"""What makes a team's own JAX model a family the worker loop trains in a few lines
(``run_training(shape, run, family=...)``, ``docs/workloads/own-model.md``).

Glossary (Ray's and JAX's words):

- **family**: the object handed to ``run_training(..., family=...)``; Ray pickles it to every
  Ray Train worker (one per TPU host), which trains it with the platform's worker loop
  (:class:`workloads.training.worker_loop.WorkerLoop`). Its members are
  :data:`workloads.training.family_check.FAMILY_MEMBERS`.
- **train state**: :class:`TrainState` (``step``, ``params``, ``opt_state``), a
  ``flax.struct.dataclass``, so a pytree ``jax.jit`` takes and returns and the checkpoint tiers
  save and restore (they read ``params`` and ``opt_state``, and ``replace`` the three). It is
  the byte LM's own state class, not a copy.
- **data parallel**: :class:`DataParallel`, the mesh, shardings and FLOP count of the byte LM
  (:class:`workloads.model.family.ByteLM`): a 1-D ``jax.sharding.Mesh`` over every device of
  every slice (axis ``data``), the state replicated, each batch split over ``data`` (XLA
  all-reduces the gradients), ``flops_per_token = None`` (MFU counts 6 FLOPs a parameter).
- **step**: :func:`optax_step`, one optimizer update of a loss ``loss(params, batch)``, the
  ``train_step`` a family jits with its shardings.
- **byte windows**: :func:`byte_windows`, the shipped corpus as byte tokens (vocabulary 256),
  each host's random windows seeded by (seed, batch index, host): what a family's ``batches``
  may return.

jax is imported at module level: this module is imported by the user's family module (on the
driver too) and in the workers; nothing here makes an array at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax

from workloads.model import byte_lm
from workloads.model.family import ByteLM, CorpusWindows

TrainState = byte_lm.TrainState
"""``step``, ``params``, ``opt_state``: the state every family's ``init`` returns."""


class DataParallel:
    """A family base: ``mesh``, ``state_shardings``, ``batch_sharding`` and
    ``flops_per_token`` of data parallelism (see the module docstring); the subclass writes
    ``config`` (with ``seq_len``), ``init``, ``train_step``, ``batches`` and ``to_dict``."""

    flops_per_token: ClassVar[float | None] = None
    mesh = ByteLM.mesh
    state_shardings = ByteLM.state_shardings
    batch_sharding = ByteLM.batch_sharding


def new_state(params: Any, tx: optax.GradientTransformation) -> TrainState:
    """Step 0 of ``params`` with ``tx``'s fresh optimizer state."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def optax_step(
    tx: optax.GradientTransformation,
    loss: Callable[[Any, jax.Array], jax.Array],
    state: TrainState,
    batch: jax.Array,
) -> tuple[TrainState, jax.Array]:
    """One update of ``state`` by ``tx`` on ``loss(params, batch)``: (new state, the loss)."""
    value, grads = jax.value_and_grad(loss)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), value


def byte_windows(seq_len: int, seed: int, host: int) -> CorpusWindows:
    """This host's batches of the shipped corpus as bytes: ``[rows, seq_len + 1]`` windows."""
    from workloads.data.corpus import load_corpus

    return CorpusWindows(byte_lm.encode(load_corpus()), seq_len, seed, host)
