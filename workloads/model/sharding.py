"""The hybrid device mesh and the shardings of a preset's training state (MaxText's layout).

Glossary:

- **hybrid mesh**: axes ``(data, fsdp, tensor)`` (:class:`raytpu.presets.MeshConfig`). The
  ``data`` axis is ``dcn_data x ici_data``: its outer factor spans slices (data parallel over the
  data-centre network, one gradient all-reduce per step); ``fsdp`` and ``tensor`` stay inside a
  slice (ICI). Built with :func:`jax.experimental.mesh_utils.create_hybrid_device_mesh`, which
  groups devices by their ``slice_index``. Devices of the simulated slices (CPU) all say slice 0:
  each
  simulated host is one JAX process and a slice is ``hosts`` consecutive processes (Ray Train's
  rank order, which is also how it numbers ``MEGASCALE_SLICE_ID``), so the slice of a device is
  ``process_index // hosts_per_slice``.
- **logical axes**: each parameter's dimensions carry MaxText's names (:mod:`workloads.model.llama`);
  :data:`RULES` maps them to mesh axes. ``embed`` -> ``fsdp`` shards every weight matrix (and so
  its gradients and both AdamW moments) over the FSDP axis; ``heads``/``kv_heads``/``mlp``/
  ``vocab`` -> ``tensor`` splits matmuls. The batch is split over ``data`` and ``fsdp``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from raytpu.presets import MeshConfig, Preset
from workloads.model import llama

RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", ("data", "fsdp")),  # type: ignore[assignment]
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
)


@dataclass(frozen=True)
class _Granule:
    """A device with the slice it belongs to, for ``create_hybrid_device_mesh``."""

    device: Any
    slice_index: int

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def build_mesh(
    config: MeshConfig, devices: Sequence[Any] | None = None, *, hosts_per_slice: int = 1
) -> Mesh:
    """The ``(data, fsdp, tensor)`` mesh; with ``dcn_data > 1`` a hybrid mesh whose outer
    ``data`` factor spans slices. ``hosts_per_slice`` is used only when the devices'
    ``slice_index`` does not name ``dcn_data`` slices (CPU simulation)."""
    devices = list(devices if devices is not None else jax.devices())
    if len(devices) != config.devices:
        raise ValueError(
            f"mesh: {config.shape} (data, fsdp, tensor) needs {config.devices} devices; "
            f"valid: a mesh over the {len(devices)} devices present"
        )
    ici = (config.ici_data, config.ici_fsdp, config.ici_tensor)
    if config.dcn_data == 1:
        grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
        return Mesh(grid, MeshConfig.AXES)
    if len({getattr(d, "slice_index", None) for d in devices}) == config.dcn_data:
        grid = mesh_utils.create_hybrid_device_mesh(
            ici, (config.dcn_data, 1, 1), devices, allow_split_physical_axes=True
        )
        return Mesh(grid, MeshConfig.AXES)
    wrapped = [_Granule(d, d.process_index // max(1, hosts_per_slice)) for d in devices]
    grid = mesh_utils.create_hybrid_device_mesh(
        ici, (config.dcn_data, 1, 1), wrapped, allow_split_physical_axes=True
    )
    unwrap = np.vectorize(lambda g: g.device, otypes=[object])
    return Mesh(unwrap(grid), MeshConfig.AXES)


def slice_of_devices(mesh: Mesh) -> list[set[int]]:
    """For each index along the ``data`` axis, the process indices its devices live in."""
    return [{d.process_index for d in mesh.devices[i].flat} for i in range(mesh.devices.shape[0])]


def host_value(leaf: Any) -> Any:
    """A leaf's global value on this host: a replicated array's first shard, a sharded one
    gathered (over every process when it spans hosts: a collective, so every process calls
    this); anything else as it is."""
    from jax.experimental import multihost_utils

    if not isinstance(leaf, jax.Array):
        return leaf
    if leaf.sharding.is_fully_replicated:
        return leaf.addressable_data(0)
    if not leaf.is_fully_addressable:
        return multihost_utils.process_allgather(leaf, tiled=True)
    return leaf


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P(("data", "fsdp")))


def state_shardings(preset: Preset, mesh: Mesh) -> Any:
    """The :class:`workloads.model.llama.TrainState` tree of ``NamedSharding``: params and both AdamW
    moments by :data:`RULES`, scalars replicated."""
    abstract = jax.eval_shape(partial(llama.init_state, preset), jax.random.PRNGKey(0))
    logical = nn.get_partition_spec(abstract)
    return nn.logical_to_mesh_sharding(logical, mesh, RULES)


def sharded_init(preset: Preset, mesh: Mesh, seed: int) -> Any:
    """The initial state created directly in its shards (never whole on one device), with the
    logical-axis boxes removed: plain arrays whose ``.sharding`` says where each shard lives
    (what Orbax saves and restores onto another mesh)."""
    shardings = state_shardings(preset, mesh)
    init = jax.jit(
        lambda rng: nn.meta.unbox(llama.init_state(preset, rng)), out_shardings=shardings
    )
    return init(jax.random.PRNGKey(seed))


def abstract_state(preset: Preset, mesh: Mesh) -> Any:
    """The unboxed state's shapes, dtypes and shardings, with nothing computed: the target to
    restore a checkpoint into (a resumed run skips compiling and running the initializer)."""
    shapes = jax.eval_shape(
        lambda rng: nn.meta.unbox(llama.init_state(preset, rng)), jax.random.PRNGKey(0)
    )
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes,
        state_shardings(preset, mesh),
    )


def sharded_step(preset: Preset, mesh: Mesh) -> Any:
    """``train_step`` jitted with the state's shardings in and out (donated) and the batch
    split over ``data`` and ``fsdp``."""
    shardings = state_shardings(preset, mesh)
    replicated = NamedSharding(mesh, P())
    return jax.jit(
        partial(llama.train_step, preset),
        in_shardings=(shardings, batch_sharding(mesh)),
        out_shardings=(shardings, replicated),
        donate_argnums=0,
    )
