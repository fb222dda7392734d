"""One protocol for every model family the worker loop trains and a Serve replica decodes.

Glossary:

- **family**: a model (its config, its parameters' tree) with the pure functions a JAX program
  needs around it: ``init`` (a new :class:`TrainState`, plain arrays), ``loss`` and
  ``train_step`` (to ``jax.jit``), the shardings of the state and of a batch on a mesh, and the
  decode step (``next_logits``: the next token's logits given the tokens so far, for serving).
  :class:`ByteLM` (:mod:`workloads.model.byte_lm`, 1-D ``data`` mesh, replicated state) and
  :class:`Llama` (:mod:`workloads.model.llama` presets on the hybrid ``(data, fsdp, tensor)``
  mesh of :mod:`workloads.model.sharding`) implement it.
- **batches**: each family's per-host data (:meth:`ModelFamily.batches`): a pure function of
  (seed, batch index, host), so a restarted or rolled-back run reads the same batches.
- **spec**: what a checkpoint's ``meta`` records (:meth:`ModelFamily.to_dict`: ``family``,
  ``model`` and, for a preset, its tokenizer); :func:`family_for` turns it back into a family.

jax is imported at module level: this module is imported only inside workers and replicas.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar, Protocol

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from raytpu.errors import invalid
from raytpu.presets import MeshConfig, Preset
from workloads.model import byte_lm, llama


class Batches(Protocol):
    def batch(self, index: int, rows: int) -> np.ndarray:
        """Batch ``index``'s ``[rows, seq_len + 1]`` token ids of this host."""
        ...


class ModelFamily(Protocol):
    """What the worker loop and a Serve replica need of a model (see the module docstring)."""

    name: ClassVar[str]

    @property
    def config(self) -> Any: ...

    @property
    def flops_per_token(self) -> float | None: ...

    def init(self, rng: jax.Array) -> Any: ...

    def loss(self, params: Any, batch: jax.Array) -> jax.Array: ...

    def train_step(self, state: Any, batch: jax.Array) -> tuple[Any, jax.Array]: ...

    def mesh(self, devices: Sequence[Any]) -> Mesh: ...

    def state_shardings(self, mesh: Mesh) -> Any: ...

    def batch_sharding(self, mesh: Mesh) -> NamedSharding: ...

    def next_logits(self, params: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        """The decode step: ``[B, vocab]`` logits of the token after row ``b``'s first
        ``lengths[b]`` tokens of ``tokens`` ``[B, width]`` (right-padded: the model is causal)."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...

    def batches(self, seed: int, host: int, hosts: int) -> Batches: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True, eq=False)
class CorpusWindows:
    """The byte LM's batches: random windows of the corpus seeded by (seed, index, host)."""

    corpus: np.ndarray
    seq_len: int
    seed: int
    host: int

    def batch(self, index: int, rows: int) -> np.ndarray:
        seed = (self.seed, index, self.host)
        return byte_lm.sample_batch(self.corpus, rows, self.seq_len, seed=seed)


@dataclass(frozen=True)
class ByteLM:
    """The byte-level LM: a 1-D ``data`` mesh, the state replicated, the batch split over it."""

    config: byte_lm.ModelConfig = field(default_factory=byte_lm.ModelConfig)
    name: ClassVar[str] = "byte-lm"
    flops_per_token: ClassVar[float | None] = None

    def init(self, rng: jax.Array) -> byte_lm.TrainState:
        return byte_lm.init_state(self.config, rng)

    def loss(self, params: Any, batch: jax.Array) -> jax.Array:
        return byte_lm.loss_fn(params, self.config, batch)

    def train_step(self, state: Any, batch: jax.Array) -> tuple[Any, jax.Array]:
        return byte_lm.train_step(self.config, state, batch)

    def mesh(self, devices: Sequence[Any]) -> Mesh:
        return Mesh(np.array(list(devices)), ("data",))

    def state_shardings(self, mesh: Mesh) -> NamedSharding:
        return NamedSharding(mesh, P())

    def batch_sharding(self, mesh: Mesh) -> NamedSharding:
        return NamedSharding(mesh, P("data"))

    def next_logits(self, params: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        return _at(byte_lm.logits_fn(params, self.config, tokens), lengths)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in byte_lm.encode(text)]

    def decode(self, tokens: Sequence[int]) -> str:
        return byte_lm.decode(tokens)

    def batches(self, seed: int, host: int, hosts: int) -> CorpusWindows:
        from workloads.data.corpus import load_corpus

        corpus = byte_lm.encode(load_corpus())
        return CorpusWindows(corpus, self.config.seq_len, seed, host)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.name, "model": self.config.to_dict()}


@dataclass(frozen=True)
class Llama:
    """A :mod:`raytpu.presets` preset with its BPE tokenizer (JSON), on the hybrid mesh of
    ``mesh_config`` (default: FSDP over every device) with ``hosts_per_slice`` hosts a slice."""

    preset: Preset
    tokenizer: str = field(default="", repr=False)
    mesh_config: MeshConfig | None = None
    hosts_per_slice: int = 1
    name: ClassVar[str] = "llama"

    @property
    def config(self) -> Preset:
        return self.preset

    @property
    def flops_per_token(self) -> float:
        return self.preset.train_flops_per_token()

    def init(self, rng: jax.Array) -> llama.TrainState:
        import flax.linen as nn

        return nn.meta.unbox(llama.init_state(self.preset, rng))

    def state_from(self, params: Any) -> llama.TrainState:
        """Step 0 of given parameters (a Hugging Face checkpoint's) with a new optimizer state."""
        return llama.TrainState(
            step=jax.numpy.zeros((), jax.numpy.int32),
            params=params,
            opt_state=llama.optimizer().init(params),
        )

    def loss(self, params: Any, batch: jax.Array) -> jax.Array:
        return llama.loss_fn(params, self.preset, batch)

    def train_step(self, state: Any, batch: jax.Array) -> tuple[Any, jax.Array]:
        return llama.train_step(self.preset, state, batch)

    def mesh(self, devices: Sequence[Any]) -> Mesh:
        from workloads.model import sharding

        devices = list(devices)
        config = self.mesh_config or MeshConfig.fsdp_over(len(devices))
        return sharding.build_mesh(config, devices, hosts_per_slice=self.hosts_per_slice)

    def state_shardings(self, mesh: Mesh) -> Any:
        from workloads.model import sharding

        return sharding.state_shardings(self.preset, mesh)

    def batch_sharding(self, mesh: Mesh) -> NamedSharding:
        from workloads.model import sharding

        return sharding.batch_sharding(mesh)

    def next_logits(self, params: Any, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        logits, _ = llama.LlamaLM(self.preset).apply({"params": params}, tokens)
        return _at(logits, lengths)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self._loaded.encode(text).ids]

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._loaded.decode([int(t) for t in tokens]))

    def batches(self, seed: int, host: int, hosts: int) -> Any:
        from workloads.data.corpus import load_corpus
        from workloads.data.text_data import HostShard, encode, windows

        tokens = encode(self._loaded, load_corpus())
        return HostShard(windows(tokens, self.preset.seq_len), host, hosts, seed)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.name, "model": self.preset.to_dict(), "tokenizer": self.tokenizer}

    @cached_property
    def _loaded(self) -> Any:
        from workloads.data.text_data import load_tokenizer

        if not self.tokenizer:
            raise ValueError(invalid("tokenizer", "", "the BPE tokenizer's JSON of the preset"))
        return load_tokenizer(self.tokenizer)


def _at(logits: jax.Array, lengths: jax.Array) -> jax.Array:
    """Row ``b``'s logits at position ``lengths[b] - 1``."""
    return logits[jax.numpy.arange(logits.shape[0]), lengths - 1]


FAMILIES = (ByteLM.name, Llama.name)


def family_for(spec: Mapping[str, Any]) -> ModelFamily:
    """The family a spec names (a checkpoint's ``meta``, or a worker's): ``family`` (default
    ``byte-lm``, what checkpoints from before families recorded), ``model`` (the config's
    fields), and for ``llama`` ``tokenizer``, ``mesh`` and ``hosts_per_slice``."""
    name = spec.get("family", ByteLM.name)
    model = dict(spec.get("model") or {})
    if name == ByteLM.name:
        return ByteLM(byte_lm.ModelConfig.from_dict(model))
    if name == Llama.name:
        mesh = spec.get("mesh")
        return Llama(
            Preset(**model),
            tokenizer=str(spec.get("tokenizer", "")),
            mesh_config=MeshConfig(**mesh) if mesh else None,
            hosts_per_slice=int(spec.get("hosts_per_slice", 1)),
        )
    raise ValueError(invalid("family", name, FAMILIES))
