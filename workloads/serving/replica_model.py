"""What a Serve replica decodes with: the checkpoint's model family and, for the byte LM and a
Llama preset or Hugging Face folder alike, the KV-cached engine (:mod:`workloads.serving.engine`,
prefix cache included) over that family's decoder (:mod:`workloads.serving.engine.decoders`).

jax is imported inside: the driver imports :mod:`workloads.serving.replica` without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVE_CONTEXT = 1024
"""A Llama replica's KV-cache length per row (prompt plus new tokens), at most its
``seq_len`` (a Hugging Face folder's ``max_position_embeddings``)."""


@dataclass(frozen=True, eq=False)
class ReplicaModel:
    """A replica's restored checkpoint, its model family, and the engine that decodes it."""

    family: Any
    step: int
    engine: Any


def load_replica_model(
    checkpoint_dir: str,
    mesh: Any,
    buckets: tuple[int, ...],
    options: Any,
    on_prefix: Callable[..., None],
    max_new_tokens: int,
) -> ReplicaModel:
    """The latest checkpoint's parameters replicated over ``mesh`` and the KV-cached engine
    that decodes them; ``options`` (:class:`workloads.serving.replica.ServeOptions`) says how
    the prefix cache is sized and whether every bucket is compiled now. ``checkpoint_dir`` is
    a run's Orbax directory (the byte LM or a preset) or a Hugging Face Llama folder
    (``config.json`` and safetensors, local or ``gs://``: :mod:`workloads.model.hf_llama`; its
    step is 0)."""
    from workloads.model import byte_lm as model

    params, family, step = _restore(checkpoint_dir, model.replicated(mesh))
    decoder = _decoder(family)
    engine = _engine(params, decoder, mesh, buckets, options, on_prefix, max_new_tokens)
    return ReplicaModel(family, step, engine)


def _decoder(family: Any) -> Any:
    """The engine's decoder for the checkpoint's family (its name says which)."""
    from workloads.model.family import ByteLM
    from workloads.serving.engine.decoders import ByteDecoder, LlamaDecoder

    if family.name == ByteLM.name:
        return ByteDecoder(family.config)
    return LlamaDecoder(family, min(family.preset.seq_len, SERVE_CONTEXT))


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
    decoder: Any,
    mesh: Any,
    buckets: tuple[int, ...],
    options: Any,
    on_prefix: Callable[..., None],
    max_new_tokens: int,
) -> Any:
    """The engine and its prefix cache, compiled now, not on a request."""
    from workloads.model import byte_lm as model
    from workloads.serving.engine.engine import Engine
    from workloads.serving.engine.prefix_cache import PrefixCache, directory

    prefix = None
    if options.prefix_cache:
        prefix = PrefixCache(
            decoder,
            f"{model.params_digest(params)}:{decoder}",
            device_blocks=options.device_blocks,
            host_blocks=options.host_blocks,
            shared=directory() if options.shared_prefix else None,
            on_counts=on_prefix,
        )
    engine = Engine(params, decoder, mesh, buckets, prefix, max_new_tokens)
    engine.warm_up(options.precompile)
    return engine
