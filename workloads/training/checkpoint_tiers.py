"""Tiered checkpoints: a fast tier on each host's local disk, the durable tier on the bucket.

- **fast tier**: every ``goodput.fast_every`` steps each host writes the whole training state to
  its own local directory (``goodput.fast_dir``, under the host's temp folder unless absolute),
  one ``.npz`` per step, written beside and renamed into place, so a file that exists is complete.
  Each host can do it alone because the parameters and optimizer state are replicated (the mesh
  shards the data only): every host holds all of it.
- **durable tier**: the Orbax checkpoints of :mod:`workloads.model.checkpoint` on ``checkpoint_dir``
  (``gs://``), every ``checkpoint_every`` steps.

On (re)start every host tells the others its newest fast step (a collective);
:func:`choose_restore` picks the newest complete step across both tiers. A host that lost its fast
tier (a replaced host, or ``kill-host``) gets the state from the first peer that has it
(:func:`restore_fast`, a broadcast over the mesh), or every host restores the durable tier.

Orbax's ``orbax.checkpoint.experimental.emergency`` (0.12) is not used: its
``CheckpointManager`` keeps the local tier on the *non-primary slices* of a multi-slice run and
the persistent one on the primary slice (one slice has nothing to replicate from), needs a
replica-axis mesh, and is marked "experimental; do not use without specific approval". With
replicated state a plain per-host file does the same job in ~60 lines. A preset's sharded state
is gathered whole onto every host first (:func:`workloads.model.sharding.host_value`): right for
the small presets the simulation trains; a large one would need Orbax's per-host shards and peer
exchange instead.

:func:`choose_restore` is pure; the rest imports jax inside.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FAST_KEEP = 2
_STEP_FILE = re.compile(r"^step_(\d+)\.npz$")


@dataclass(frozen=True)
class RestorePlan:
    tier: str
    """``fast``, ``durable`` or ``none`` (start from scratch)."""
    step: int
    source: int = -1
    """The fast tier: the first host (process index) that has ``step``."""
    local: tuple[int, ...] = ()
    """The fast tier: the hosts that have ``step`` on their own disk."""


def choose_restore(fast_steps: list[list[int]], durable_step: int | None) -> RestorePlan:
    """``fast_steps[h]``: the complete fast steps on host ``h``; the newest step of either tier
    (the durable one on a tie: every host reads it alike)."""
    newest_fast = max((s for steps in fast_steps for s in steps), default=None)
    if newest_fast is not None and (durable_step is None or newest_fast > durable_step):
        holders = tuple(h for h, steps in enumerate(fast_steps) if newest_fast in steps)
        return RestorePlan("fast", newest_fast, holders[0], holders)
    if durable_step is not None:
        return RestorePlan("durable", durable_step)
    return RestorePlan("none", 0)


def fast_root(fast_dir: str) -> Path:
    """``fast_dir`` as given if absolute (a local SSD mount), else under this host's temp folder
    (not its working directory: Ray Train moves a worker's into each run's own folder)."""
    path = Path(fast_dir)
    return path if path.is_absolute() else Path(tempfile.gettempdir()) / path


def fast_steps(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    found = (_STEP_FILE.match(p.name) for p in directory.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def save_fast(directory: Path, step: int, state: Any, meta: dict[str, Any]) -> Path:
    """This host's copy of ``state`` and ``meta`` at ``step``: replicated arrays as they are,
    sharded ones gathered whole (a collective: every host saves the same steps)."""
    import jax
    import numpy as np

    from workloads.model.sharding import host_value

    directory.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree.leaves((state.params, state.opt_state))
    arrays = {f"a{i}": np.asarray(host_value(leaf)) for i, leaf in enumerate(leaves)}
    target = directory / f"step_{step}.npz"
    partial = directory / f".step_{step}.npz.partial"
    with partial.open("wb") as out:
        np.savez(out, meta=np.asarray(json.dumps(meta)), **arrays)
    partial.replace(target)
    for old in fast_steps(directory)[:-FAST_KEEP]:
        (directory / f"step_{old}.npz").unlink(missing_ok=True)
    return target


def wipe(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def restore_fast(directory: Path, plan: RestorePlan, like: Any, process_index: int) -> tuple:
    """(state, meta) at ``plan.step``: read from this host's disk if it has it, else received
    from host ``plan.source`` (every host must call this: it is a collective when some lack it)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils

    tree = (like.params, like.opt_state)
    leaves, treedef = jax.tree.flatten(tree)
    everyone_has_it = len(plan.local) == jax.process_count()
    mine = process_index in plan.local
    if mine:
        with np.load(directory / f"step_{plan.step}.npz") as data:
            host = [data[f"a{i}"] for i in range(len(leaves))]
            meta = json.loads(str(data["meta"]))
    else:
        host = [np.zeros(leaf.shape, leaf.dtype) for leaf in leaves]
        meta = {}
    if not everyone_has_it:
        host = multihost_utils.broadcast_one_to_all(host, is_source=process_index == plan.source)
        meta_bytes = np.frombuffer(json.dumps(meta).encode().ljust(8192), np.uint8)
        meta_bytes = multihost_utils.broadcast_one_to_all(
            meta_bytes, is_source=process_index == plan.source
        )
        meta = json.loads(bytes(np.asarray(meta_bytes)).decode().strip())
    placed = [_place(np.asarray(a), leaf.sharding) for a, leaf in zip(host, leaves, strict=True)]
    params, opt_state = jax.tree.unflatten(treedef, placed)
    step = jax.device_put(jnp.asarray(plan.step, jnp.int32), like.step.sharding)
    return like.replace(step=step, params=params, opt_state=opt_state), meta


def _place(value: Any, sharding: Any) -> Any:
    """The global ``value`` (on every host) as an array of ``sharding``: each host puts only
    its own shards (a sharding may span hosts)."""
    import jax

    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
