"""Run by tests/test_sharding.py in a subprocess with 8 host CPU devices: trains the tiny preset
for a few steps on a pure data-parallel mesh and on an FSDP x tensor mesh from the same seed and
batches, and prints the losses and every parameter's and AdamW moment's shard layout as JSON."""

from __future__ import annotations

import json
import sys

import flax.linen as nn
import jax
import numpy as np

from raytpu.presets import MeshConfig, preset
from workloads.model import sharding
from workloads.model.byte_lm import params_digest

STEPS = 4


def layout(tree):
    rows = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if not isinstance(leaf, jax.Array) or leaf.ndim == 0:
            continue
        shards = leaf.addressable_shards
        rows[jax.tree_util.keystr(path)] = {
            "size": int(leaf.size),
            "shard_sizes": sorted({int(s.data.size) for s in shards}),
            "devices": len(shards),
            "spec": [str(a) for a in leaf.sharding.spec],
            "dtype": str(leaf.dtype),
        }
    return rows


def train(mesh_config: MeshConfig) -> dict:
    model = preset("tiny")
    mesh = sharding.build_mesh(mesh_config)
    state = sharding.sharded_init(model, mesh, seed=0)
    digests = {
        "init": params_digest(state.params),
        "init_on_host": params_digest(jax.device_get(state.params)),
    }
    step = sharding.sharded_step(model, mesh)
    rng = np.random.default_rng(0)
    batch = rng.integers(0, model.vocab_size, size=(16, model.seq_len + 1)).astype(np.int32)
    losses = []
    for _ in range(STEPS):
        state, loss = step(state, jax.device_put(batch, sharding.batch_sharding(mesh)))
        losses.append(float(loss))
    return {
        "losses": losses,
        "digests": digests,
        "mesh": dict(mesh.shape),
        "params": layout(nn.meta.unbox(state.params)),
        "moments": layout(nn.meta.unbox(state.opt_state)),
    }


def matmul_dtypes() -> list[str]:
    """The input dtypes of every matmul in the traced loss (the compute precision)."""
    from functools import partial

    from workloads.model import llama

    model = preset("tiny")
    params = nn.meta.unbox(llama.init_state(model, jax.random.PRNGKey(0)).params)
    batch = np.zeros((2, model.seq_len + 1), np.int32)
    jaxpr = jax.make_jaxpr(partial(llama.loss_fn, preset=model, batch=batch))(params)
    found = set()

    def walk(jp):
        for eqn in jp.eqns:
            if eqn.primitive.name == "dot_general":
                found.update(str(v.aval.dtype) for v in eqn.invars)
            for sub in jax.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr.jaxpr)
    return sorted(found)


if __name__ == "__main__":
    result = {
        "matmul_dtypes": matmul_dtypes(),
        "devices": jax.device_count(),
        "dp": train(MeshConfig(ici_data=8)),
        "fsdp": train(MeshConfig(ici_fsdp=4, ici_tensor=2)),
    }
    json.dump(result, sys.stdout)
