"""A BPE tokenizer trained on the shipped corpus, and the per-host data shard for the presets.

- **tokenizer**: byte-level BPE (Hugging Face ``tokenizers``, the Rust library, no model hub)
  trained on ``workloads/data/corpus.txt`` to the preset's ``vocab_size``. Nothing is
  downloaded. The driver trains it once and ships the JSON to every worker
  (:func:`tokenizer_json` -> :func:`load_tokenizer`), so every host tokenizes with the identical
  merges.
- **shard**: the tokenized corpus is cut into windows of ``seq_len + 1`` tokens; host ``i`` of
  ``n`` (``jax.process_index()`` of ``jax.process_count()``) owns windows ``i, i + n, i + 2n, ...``
  and draws its local batches only from them (:class:`HostShard`), reshuffled every epoch from
  the run's seed. No window is on two hosts.

The pipeline is Grain's (``grain.MapDataset``: source, ``[host::hosts]``, shuffle, repeat,
batch), what MaxText feeds TPU hosts with, and not Ray Data, for three reasons:

- **random access by step**: a ``MapDataset`` is indexable, so the batch of step ``s`` is
  ``dataset[s]``, a pure function of (seed, host, hosts, step). Resuming after host loss or a
  preemption needs no saved iterator state, and an interrupted run trains on exactly the
  batches of an uninterrupted one.
- **each host reads only its records**: the slice ``[host::hosts]`` is taken before anything is
  read; with a real dataset the source is an ``ArrayRecordDataSource`` on ``gs://`` and the host
  reads only its own records. Ray Data would stream blocks from the driver through the object
  store to the workers: a second copy of data each host can read itself, and traffic on the
  DCN the collectives need.
- **prefetch on the host**: :meth:`HostShard.batches` reads ahead in a thread
  (``grain.ReadOptions``) while the step runs on the device, inside the worker, with no extra
  Ray tasks competing for the host's CPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from raytpu.errors import invalid

SPECIAL = ("<|endoftext|>",)


def tokenizer_json(text: str, vocab_size: int) -> str:
    """Train byte-level BPE on ``text`` to ``vocab_size`` tokens; the tokenizer as JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL):
        raise ValueError(
            invalid(
                "vocab_size",
                vocab_size,
                f">= {256 + len(SPECIAL)} (every byte plus the special tokens)",
            )
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    return tokenizer.to_str()


def load_tokenizer(json_text: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(json_text)


def encode(tokenizer: Any, text: str) -> np.ndarray:
    return np.asarray(tokenizer.encode(text).ids, dtype=np.int32)


def windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """``[count, seq_len + 1]`` non-overlapping windows of ``tokens`` (the tail is dropped)."""
    width = seq_len + 1
    count = len(tokens) // width
    if count < 1:
        raise ValueError(
            invalid(
                "seq_len",
                seq_len,
                f"< {len(tokens)}",
                reason=f"the corpus has {len(tokens)} tokens",
            )
        )
    return tokens[: count * width].reshape(count, width)


@dataclass(frozen=True)
class HostShard:
    """The windows host ``host`` of ``hosts`` owns, and its local batches (a Grain pipeline)."""

    all_windows: np.ndarray
    host: int
    hosts: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.host < self.hosts:
            raise ValueError(invalid("host", self.host, f"0..{self.hosts - 1}"))

    @property
    def indices(self) -> np.ndarray:
        """Global window indices this host owns: ``host, host + hosts, ...``."""
        return np.arange(self.host, len(self.all_windows), self.hosts)

    def dataset(self, local_batch: int) -> Any:
        """``grain.MapDataset`` whose item ``s`` is step ``s``'s ``[local_batch, seq_len + 1]``
        windows: this host's shard, reshuffled every epoch from the seed, repeated forever."""
        import grain

        owned = len(self.indices)
        if not 0 < local_batch <= owned:
            raise ValueError(
                invalid(
                    "local_batch",
                    local_batch,
                    f"1..{owned} (the windows of host {self.host}'s shard)",
                )
            )
        source = grain.MapDataset.source(self.all_windows)[self.host :: self.hosts]
        return source.shuffle(seed=self.seed).repeat().batch(local_batch, drop_remainder=True)

    def batch(self, step: int, local_batch: int) -> np.ndarray:
        """Step ``step``'s local batch (random access: no iterator state to restore)."""
        return np.asarray(self.dataset(local_batch)[step])

    def batches(self, start: int, stop: int, local_batch: int, prefetch: int = 2) -> Iterator[Any]:
        """Steps ``start..stop-1``'s local batches, read ``prefetch`` ahead in a thread."""
        import grain

        steps = self.dataset(local_batch)[start:stop]
        options = grain.ReadOptions(num_threads=1, prefetch_buffer_size=prefetch)
        return iter(steps.to_iter_dataset(options))
