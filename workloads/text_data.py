"""A BPE tokenizer trained on the shipped corpus, and the per-host data shard for the presets.

- **tokenizer**: byte-level BPE (Hugging Face ``tokenizers``, the Rust library, no model hub)
  trained on ``workloads/data/corpus.txt`` to the preset's ``vocab_size``. Nothing is
  downloaded. The driver trains it once and ships the JSON to every worker
  (:func:`tokenizer_json` -> :func:`load_tokenizer`), so every host tokenizes with the identical
  merges.
- **shard**: the tokenized corpus is cut into windows of ``seq_len + 1`` tokens; host ``i`` of
  ``n`` (``jax.process_index()`` of ``jax.process_count()``) owns windows ``i, i + n, i + 2n, ...``
  and draws its local batch only from them (:class:`HostShard`), shuffled per epoch from the run's
  seed. Each host reads only its own shard; no window is on two hosts.

Why a plain sharded iterator and not Grain or Ray Data: the corpus is 300 KB shipped in the image,
tokenized in well under a second, so the whole pipeline is an index computation. Ray Data would
stream blocks from the driver through the object store to each worker for data every worker
already has; Grain would add a dependency and its own worker processes to do what
:class:`HostShard` does in 20 lines. For a real dataset on ``gs://`` (ArrayRecord files), Grain's
``IndexSampler`` with ``ShardByJaxProcess`` is the drop-in: the same ownership rule, reading only
the host's records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

SPECIAL = ("<|endoftext|>",)


def tokenizer_json(text: str, vocab_size: int) -> str:
    """Train byte-level BPE on ``text`` to ``vocab_size`` tokens; the tokenizer as JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL):
        raise ValueError(
            f"vocab_size: {vocab_size!r} is not valid; valid: >= {256 + len(SPECIAL)} "
            "(every byte plus the special tokens)"
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
            f"seq_len: {seq_len!r} is not valid for a corpus of {len(tokens)} tokens; "
            f"valid: < {len(tokens)}"
        )
    return tokens[: count * width].reshape(count, width)


@dataclass(frozen=True)
class HostShard:
    """The windows host ``host`` of ``hosts`` owns, and its local batches."""

    all_windows: np.ndarray
    host: int
    hosts: int
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.host < self.hosts:
            raise ValueError(f"host: {self.host!r} is not valid; valid: 0..{self.hosts - 1}")

    @property
    def indices(self) -> np.ndarray:
        """Global window indices this host owns: ``host, host + hosts, ...``."""
        return np.arange(self.host, len(self.all_windows), self.hosts)

    def batch(self, step: int, local_batch: int) -> np.ndarray:
        """``[local_batch, seq_len + 1]`` windows of this host's shard for ``step``: an epoch
        is one pass over the shard in an order shuffled from ``(seed, epoch, host)``."""
        owned = self.indices
        if local_batch > len(owned):
            raise ValueError(
                f"local_batch: {local_batch!r} is not valid; valid: <= {len(owned)} (the "
                f"windows of host {self.host}'s shard)"
            )
        per_epoch = len(owned) // local_batch
        epoch, offset = divmod(step, per_epoch)
        order = np.random.default_rng((self.seed, epoch, self.host)).permutation(owned)
        return self.all_windows[order[offset * local_batch : (offset + 1) * local_batch]]
