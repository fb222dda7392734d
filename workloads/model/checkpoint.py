"""Orbax checkpoints of the LM's training state: save, restore, and load parameters for serving.

Glossary: a **checkpoint directory** is one Orbax ``CheckpointManager`` root (a local path, or
``gs://BUCKET/run`` on GKE) holding one numbered folder per saved **step**, each with the
``params``, the ``opt_state`` and a small JSON ``meta`` (the step and the model family:
:meth:`workloads.model.family.ModelFamily.to_dict`). Every
training process writes its own shards of a step; serving restores only ``params``.

jax and orbax are imported inside the functions: the driver imports this module without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.storage import is_remote, quiet_clients


def open_checkpoints(directory: str) -> Any:
    """An Orbax CheckpointManager on ``directory`` (local path or ``gs://``), last 3 kept."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=3, create=True)
    return ocp.CheckpointManager(orbax_path(directory), options=options)


def orbax_path(directory: str) -> Any:
    if is_remote(directory):
        from etils import epath

        quiet_clients()
        return epath.Path(directory)
    return Path(directory).absolute()


def save_state(manager: Any, step: int, state: Any, family: Any) -> None:
    """Save ``state`` at ``step``; the meta records the model family
    (:meth:`workloads.model.family.ModelFamily.to_dict`), which serving restores it with."""
    import orbax.checkpoint as ocp

    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(state.params),
            opt_state=ocp.args.StandardSave(state.opt_state),
            meta=ocp.args.JsonSave({"step": step, **family.to_dict()}),
        ),
    )


def restore_state(manager: Any, step: int, like: Any) -> Any:
    """Restore params and optimizer state into the shardings of ``like``."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    def abstract(tree: Any) -> Any:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
        )

    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract(like.params)),
            opt_state=ocp.args.StandardRestore(abstract(like.opt_state)),
        ),
    )
    step_array = jax.device_put(jnp.asarray(step, jnp.int32), like.step.sharding)
    return like.replace(step=step_array, params=restored.params, opt_state=restored.opt_state)


def restore_params(
    directory: str, step: int | None = None, sharding: Any = None
) -> tuple[Any, Any, int]:
    """(params, model family, step) from a checkpoint dir (local or ``gs://``); the family
    (:func:`workloads.model.family.family_for` of the checkpoint's meta) carries the config.

    ``sharding``: where every parameter goes (e.g. replicated over a Serve replica's mesh,
    :func:`workloads.model.byte_lm.replicated`); default: this process's first device. Used by Serve
    replicas and tests (one process, any device count).
    """
    import jax
    import orbax.checkpoint as ocp

    from workloads.model.family import family_for

    manager = ocp.CheckpointManager(orbax_path(directory))
    try:
        chosen = manager.latest_step() if step is None else step
        if chosen is None:
            raise FileNotFoundError(f"checkpoint_dir: {directory!r} has no checkpoint")
        meta = manager.restore(chosen, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        family = family_for(meta)
        device = sharding or jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        shapes = jax.eval_shape(lambda: family.init(jax.random.PRNGKey(0)).params)
        target = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), shapes
        )
        restored = manager.restore(
            chosen, args=ocp.args.Composite(params=ocp.args.StandardRestore(target))
        )
        return restored.params, family, int(chosen)
    finally:
        manager.close()
