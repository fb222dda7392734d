"""Training a preset over N slices: what ``run_training(..., scale=...)`` adds to the one worker
loop (:class:`workloads.training.worker_loop.WorkerLoop`): the driver's payload, the worker's
family spec, its ``MEGASCALE_*`` checks and what it reports of the mesh.

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
from typing import Any

from raytpu.catalog import SliceShape
from raytpu.presets import Preset, ScaleConfig, preset

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
    trains the tokenizer once, on the driver, for every worker; with ``scale.init_from`` the
    preset and the tokenizer are the Hugging Face folder's (``config.json``, ``tokenizer.json``)."""
    model, tokenizer = _model_and_tokenizer(scale)
    estimate = scale.check(shape, num_slices, global_batch, model)
    logger.info(
        "preset %s on %d x %s, mesh %s: %s per chip",
        model.name,
        num_slices,
        shape.name,
        scale.mesh.shape,
        estimate.describe(),
    )
    return {
        **scale.to_dict(),
        "model": model.to_dict(),
        "num_slices": num_slices,
        "hosts_per_slice": shape.hosts,
        "tokenizer": tokenizer,
    }


def _model_and_tokenizer(scale: ScaleConfig) -> tuple[Preset, str]:
    if scale.init_from:
        from workloads.model import hf_llama

        return hf_llama.read_preset(scale.init_from), hf_llama.read_tokenizer(scale.init_from)
    from workloads.data.corpus import load_corpus
    from workloads.data.text_data import tokenizer_json

    model = preset(scale.preset)
    return model, tokenizer_json(load_corpus(), model.vocab_size)


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


def family_spec(model: dict[str, Any], payload: dict[str, Any] | None) -> dict[str, Any]:
    """The worker's :func:`workloads.model.family.family_for` spec: the byte LM with the run's
    ``model`` overrides, or the payload's preset (:func:`driver_payload`) on its mesh."""
    if not payload:
        return {"family": "byte-lm", "model": dict(model)}
    return {
        "family": "llama",
        "model": payload.get("model") or preset(payload["preset"]).to_dict(),
        "tokenizer": payload["tokenizer"],
        "mesh": payload["mesh"],
        "hosts_per_slice": payload["hosts_per_slice"],
    }


def worker_env(payload: dict[str, Any] | None, process_index: int) -> dict[str, str]:
    """A preset run's :func:`megascale_env` checks on this worker (nothing for the byte LM)."""
    if not payload:
        return {}
    return megascale_env(payload["num_slices"], process_index, payload["hosts_per_slice"])


def scale_report(family: Any, mesh: Any, env: dict[str, str], state: Any, shard: Any) -> dict:
    """What a preset run reports of its mesh: the axes, which processes the DCN axis spans,
    the ``MEGASCALE_SLICE_ID`` of every process (a collective), rank 0's env, the share of the
    embedding one device holds, rank 0's data shard and the tokenizer's vocabulary."""
    import numpy as np
    from jax.experimental import multihost_utils

    from workloads.data.text_data import load_tokenizer
    from workloads.model import sharding

    slice_ids = multihost_utils.process_allgather(
        np.array([int(env.get("MEGASCALE_SLICE_ID") or 0)], np.int32)
    )
    embed = state.params["embed"]["embedding"]
    return {
        "preset": family.preset.name,
        "mesh": dict(mesh.shape),
        "data_axis_processes": [sorted(p) for p in sharding.slice_of_devices(mesh)],
        "megascale_slice_ids": [int(x) for x in np.ravel(slice_ids)],
        "megascale_rank0": env,
        "embed_shard_fraction": embed.addressable_shards[0].data.size / embed.size,
        "shard_windows_rank0": len(shard.indices),
        "tokenizer_vocab": load_tokenizer(family.tokenizer).get_vocab_size(),
    }
