"""What a Serve replica decodes with: the checkpoint's model family, and for it the byte LM's
KV-cached engine (:mod:`workloads.serving.engine`, prefix cache included) or a preset's
:class:`workloads.serving.engine.sampler.Sampler` (the family's decode step, no KV cache).

jax is imported inside: the driver imports :mod:`workloads.serving.replica` without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class ReplicaModel:
    """A replica's restored checkpoint: exactly one of ``engine`` and ``sampler`` is set."""

    family: Any
    step: int
    engine: Any = None
    sampler: Any = None


def load_replica_model(
    checkpoint_dir: str,
    mesh: Any,
    buckets: tuple[int, ...],
    options: Any,
    on_prefix: Callable[..., None],
    max_new_tokens: int,
) -> ReplicaModel:
    """The latest checkpoint's parameters replicated over ``mesh`` and what decodes them;
    ``options`` (:class:`workloads.serving.replica.ServeOptions`) says how the byte LM's prefix
    cache is sized and whether every bucket is compiled now. ``checkpoint_dir`` is a run's
    Orbax directory or a Hugging Face Llama folder (``config.json`` and safetensors, local or
    ``gs://``: :mod:`workloads.model.hf_llama`; its step is 0)."""
    from workloads.model import byte_lm as model
    from workloads.model.family import ByteLM
    from workloads.serving.engine.sampler import Sampler

    params, family, step = _restore(checkpoint_dir, model.replicated(mesh))
    if family.name != ByteLM.name:  # a preset: the family's decode step over its window
        return ReplicaModel(family, step, sampler=Sampler(family, params, family.config.seq_len))
    return ReplicaModel(
        family,
        step,
        engine=_engine(params, family.config, mesh, buckets, options, on_prefix, max_new_tokens),
    )


def _restore(checkpoint_dir: str, replicated: Any) -> tuple[Any, Any, int]:
    """(params, family, step) of an Orbax run directory or of a Hugging Face folder."""
    import jax

    from workloads.model import hf_llama
    from workloads.model.checkpoint import orbax_path, restore_params

    if (orbax_path(checkpoint_dir) / hf_llama.CONFIG).exists():
        family = hf_llama.load_family(checkpoint_dir)
        params = hf_llama.load_params(checkpoint_dir, family.preset)
        return jax.device_put(params, replicated), family, 0
    return restore_params(checkpoint_dir, sharding=replicated)


def _engine(
    params: Any,
    cfg: Any,
    mesh: Any,
    buckets: tuple[int, ...],
    options: Any,
    on_prefix: Callable[..., None],
    max_new_tokens: int,
) -> Any:
    """The byte LM's engine and prefix cache, compiled now, not on a request."""
    from workloads.model import byte_lm as model
    from workloads.serving.engine.engine import Engine
    from workloads.serving.engine.prefix_cache import PrefixCache, directory

    prefix = None
    if options.prefix_cache:
        prefix = PrefixCache(
            cfg,
            f"{model.params_digest(params)}:{cfg}",
            device_blocks=options.device_blocks,
            host_blocks=options.host_blocks,
            shared=directory() if options.shared_prefix else None,
            on_counts=on_prefix,
        )
    engine = Engine(params, cfg, mesh, buckets, prefix, max_new_tokens)
    engine.warm_up(options.precompile)
    return engine
