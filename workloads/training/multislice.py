"""Training a preset over N slices: the worker loop behind ``run_training(..., scale=...)``.

Glossary (Ray's and MaxText's words):

- **multislice**: ``num_slices`` slices joined over the data-centre network (DCN). JaxTrainer runs
  one worker per host of every slice (``processes = hosts x slices``) and, for more than one
  slice, sets on each worker what libtpu's multislice runtime reads: ``MEGASCALE_COORDINATOR_ADDRESS``
  (rank 0's host), ``MEGASCALE_PORT``, ``MEGASCALE_NUM_SLICES`` and ``MEGASCALE_SLICE_ID``
  (``rank // workers per slice``; Ray 2.60 ``ray.train.v2.jax.config``). We do not set them
  again; each worker checks them (:func:`megascale_env`) and reports them.
- **hybrid mesh**: :func:`workloads.model.sharding.build_mesh`; the ``data`` axis's outer factor is the
  slice (``dcn_data`` = ``num_slices``), ``fsdp`` and ``tensor`` stay inside a slice.
- **resume across meshes**: the Orbax checkpoint holds each array's global shape; restoring into
  the shardings of the new mesh's state (:func:`workloads.model.checkpoint.restore_state`) reshards, so
  a run saved on 1 slice continues on 2.

The driver half (:func:`driver_payload`) imports no jax; the worker half imports it inside.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from raytpu.catalog import SliceShape
from raytpu.presets import ScaleConfig, preset

logger = logging.getLogger(__name__)

MEGASCALE_KEYS = (
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
)


def driver_payload(
    shape: SliceShape, num_slices: int, global_batch: int, scale: ScaleConfig
) -> dict[str, Any]:
    """Checks the preset against the slices (raises :class:`raytpu.presets.PresetError`) and
    trains the tokenizer once, on the driver, for every worker."""
    from workloads.data.corpus import load_corpus
    from workloads.data.text_data import tokenizer_json

    estimate = scale.check(shape, num_slices, global_batch)
    logger.info(
        "preset %s on %d x %s, mesh %s: %s per chip",
        scale.preset,
        num_slices,
        shape.name,
        scale.mesh.shape,
        estimate.describe(),
    )
    return {
        **scale.to_dict(),
        "num_slices": num_slices,
        "hosts_per_slice": shape.hosts,
        "tokenizer": tokenizer_json(load_corpus(), preset(scale.preset).vocab_size),
    }


def megascale_env(num_slices: int, process_index: int, hosts_per_slice: int) -> dict[str, str]:
    """The ``MEGASCALE_*`` this worker sees; raises ``RuntimeError`` if a multislice run lacks
    one or its slice id is not this process's slice."""
    seen = {k: os.environ.get(k, "") for k in MEGASCALE_KEYS}
    if num_slices == 1:
        return seen
    missing = [k for k, v in seen.items() if not v]
    if missing:
        raise RuntimeError(
            f"multislice run of {num_slices} slices: {', '.join(missing)} not set on process "
            f"{process_index}; JaxTrainer sets them for more than one slice"
        )
    expected = process_index // hosts_per_slice
    if seen["MEGASCALE_NUM_SLICES"] != str(num_slices) or seen["MEGASCALE_SLICE_ID"] != str(
        expected
    ):
        raise RuntimeError(
            f"process {process_index}: MEGASCALE_NUM_SLICES={seen['MEGASCALE_NUM_SLICES']} "
            f"MEGASCALE_SLICE_ID={seen['MEGASCALE_SLICE_ID']}; expected {num_slices} and "
            f"{expected} (process // {hosts_per_slice} hosts per slice)"
        )
    return seen


def train_loop_sharded(
    config: dict[str, Any],
    *,
    report: Callable[..., None],
    placement: Callable[[], Any],
) -> None:
    """One worker per host: the preset on the hybrid mesh, data from this host's shard only."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from workloads import telemetry
    from workloads.data.corpus import load_corpus
    from workloads.data.text_data import HostShard, encode, load_tokenizer, windows
    from workloads.model import sharding
    from workloads.model.byte_lm import params_digest
    from workloads.model.checkpoint import open_checkpoints, restore_state, save_state
    from workloads.training.config import TrainConfig

    began = time.monotonic()
    run = config["train"]
    payload = config["scale"]
    scale = ScaleConfig.from_dict({"preset": payload["preset"], "mesh": payload["mesh"]})
    model = preset(scale.preset)
    config["board"].placed.remote(placement())
    process, processes = jax.process_index(), jax.process_count()
    env = megascale_env(payload["num_slices"], process, payload["hosts_per_slice"])
    mesh = sharding.build_mesh(scale.mesh, hosts_per_slice=payload["hosts_per_slice"])
    tokenizer = load_tokenizer(payload["tokenizer"])
    shard = HostShard(
        windows(encode(tokenizer, load_corpus()), model.seq_len), process, processes, run["seed"]
    )
    local_batch = run["global_batch"] // processes
    step_fn = sharding.sharded_step(model, mesh)
    manager = open_checkpoints(run["checkpoint_dir"])
    resumed_from = 0
    try:
        latest = manager.latest_step()
        if latest is None:
            state = sharding.sharded_init(model, mesh, run["seed"])
        else:  # Orbax reshards onto this mesh (e.g. saved on 1 slice, restored on 2)
            state = restore_state(manager, latest, sharding.abstract_state(model, mesh))
            resumed_from = int(latest)
        meter = telemetry.TrainTelemetry.from_config(
            config.get("telemetry"),
            TrainConfig.from_dict(run),
            model,
            state.params,
            flops_per_token=model.train_flops_per_token(),
        )
        losses: list[float] = []
        batches = shard.batches(resumed_from, run["steps"], local_batch)
        for step, local in zip(range(resumed_from, run["steps"]), batches, strict=True):
            step_began = time.monotonic()
            batch = jax.make_array_from_process_local_data(sharding.batch_sharding(mesh), local)
            state, loss = step_fn(state, batch)
            losses.append(float(loss.addressable_data(0)))
            done = step + 1
            meter.step(time.monotonic() - step_began, losses[-1])
            if process == 0:
                logger.info("[train] step %d/%d loss %.4f", done, run["steps"], losses[-1])
            if done % run["checkpoint_every"] == 0 or done == run["steps"]:
                with meter.checkpoint("save"):
                    save_state(manager, done, state, model)
        manager.wait_until_finished()
        slice_ids = multihost_utils.process_allgather(
            np.array([int(env["MEGASCALE_SLICE_ID"] or 0)], np.int32)
        )
        embed = state.params["embed"]["embedding"]
        report(
            {
                "step": max(resumed_from, run["steps"]),
                "loss": losses[-1] if losses else float("nan"),
                "first_loss": losses[0] if losses else float("nan"),
                "losses": losses,
                "resumed_from": resumed_from,
                "process_count": processes,
                "device_count": jax.device_count(),
                "local_device_count": jax.local_device_count(),
                "latest_checkpoint": int(manager.latest_step() or 0),
                "params_digest": params_digest(state.params),
                "seconds": time.monotonic() - began,
                "scale": {
                    "preset": model.name,
                    "mesh": dict(mesh.shape),
                    "data_axis_processes": [sorted(p) for p in sharding.slice_of_devices(mesh)],
                    "megascale_slice_ids": [int(x) for x in np.ravel(slice_ids)],
                    "megascale_rank0": env,
                    "embed_shard_fraction": embed.addressable_shards[0].data.size / embed.size,
                    "shard_windows_rank0": len(shard.indices),
                    "tokenizer_vocab": tokenizer.get_vocab_size(),
                },
            },
            final=True,
        )
    finally:
        manager.close()
