"""What the serving engine decodes with: one :class:`Decoder` per model family that has a KV
cache, so the engine (:mod:`workloads.serving.engine.decode`), its prefix cache and the OpenAI
API serve the byte LM and a Llama preset or Hugging Face folder alike.

Glossary:

- **decoder**: a model's cached forward call (``apply``: tokens at positions, written into the
  KV cache, next-token logits back), its empty cache, its uncached forward (the reference the
  tests compare with), and its text codec. Frozen and hashable: the engine's compiled programs
  are cached per decoder.
- **context_len**: the KV cache's length, prompt plus new tokens, per row.
- **pad token**: what right-pads a prefill row; its keys land at positions no query sees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jax
import numpy as np

from raytpu.errors import invalid
from workloads.model import byte_lm, llama
from workloads.model.family import Llama


class Decoder(Protocol):
    context_len: int

    @property
    def vocab(self) -> int: ...

    @property
    def pad_token(self) -> int: ...

    def apply(
        self, params: Any, tokens: jax.Array, positions: jax.Array, kv: Any
    ) -> tuple[jax.Array, Any]: ...

    def empty_cache(self, rows: int) -> Any: ...

    def forward(self, params: Any, tokens: jax.Array) -> jax.Array: ...

    def encode(self, text: str) -> np.ndarray: ...

    def decode(self, tokens: Sequence[int]) -> str: ...


@dataclass(frozen=True)
class ByteDecoder:
    """The byte LM (:mod:`workloads.model.byte_lm`): every UTF-8 byte a token."""

    config: byte_lm.ModelConfig

    @property
    def context_len(self) -> int:
        return self.config.context_len

    @property
    def vocab(self) -> int:
        return byte_lm.VOCAB

    @property
    def pad_token(self) -> int:
        return ord(" ")

    def apply(self, params: Any, tokens: jax.Array, positions: jax.Array, kv: Any) -> Any:
        return byte_lm.DecoderLM(self.config).apply({"params": params}, tokens, positions, kv)

    def empty_cache(self, rows: int) -> byte_lm.KVCache:
        return byte_lm.empty_cache(self.config, rows)

    def forward(self, params: Any, tokens: jax.Array) -> jax.Array:
        return byte_lm.logits_fn(params, self.config, tokens)

    def encode(self, text: str) -> np.ndarray:
        return byte_lm.encode(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return byte_lm.decode(tokens)


@dataclass(frozen=True)
class LlamaDecoder:
    """A Llama preset or Hugging Face folder (:class:`workloads.model.family.Llama`) with its
    BPE tokenizer; ``context_len`` at most the preset's ``seq_len`` (a folder's
    ``max_position_embeddings``)."""

    family: Llama = field(repr=False)
    context_len: int

    def __post_init__(self) -> None:
        limit = self.family.preset.seq_len
        if not 2 <= self.context_len <= limit:
            valid = f"2..{limit} (the preset's seq_len)"
            raise ValueError(invalid("context_len", self.context_len, valid))

    @property
    def vocab(self) -> int:
        return self.family.preset.vocab_size

    @property
    def pad_token(self) -> int:
        return 0

    def apply(self, params: Any, tokens: jax.Array, positions: jax.Array, kv: Any) -> Any:
        return llama.LlamaLM(self.family.preset).apply({"params": params}, tokens, positions, kv)

    def empty_cache(self, rows: int) -> llama.KVCache:
        return llama.empty_cache(self.family.preset, rows, self.context_len)

    def forward(self, params: Any, tokens: jax.Array) -> jax.Array:
        return llama.LlamaLM(self.family.preset).apply({"params": params}, tokens)[0]

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.family.encode(text), np.int32)

    def decode(self, tokens: Sequence[int]) -> str:
        return self.family.decode(tokens)

    def __str__(self) -> str:
        return f"LlamaDecoder({self.family.preset}, context_len={self.context_len})"


_REPLACEMENT_CHAR = "\ufffd"


def as_decoder(model: Any) -> Any:
    """The decoder for ``model``: a byte LM :class:`workloads.model.byte_lm.ModelConfig` (the
    engine's callers that predate the other families pass one) or a decoder already."""
    return ByteDecoder(model) if isinstance(model, byte_lm.ModelConfig) else model


class TextStream:
    """A streamed row's new tokens as UTF-8 bytes, chunk by chunk (a server-sent event's text
    is decoded from them incrementally: :mod:`workloads.serving.openai_api`). The byte LM's
    tokens are the bytes; a BPE row is decoded a window at a time, holding back a trailing
    replacement character (a character whose bytes span tokens) until the row's ``total``-th
    token.

    The window is the tokens since the end of the last-but-one whole chunk: one chunk of context
    before the new tokens (a BPE token's leading space depends on what precedes it), so each push
    decodes a bounded window, not the whole row again."""

    def __init__(self, decoder: Any, total: int) -> None:
        self._decoder, self._total, self._tokens = decoder, total, []
        self._start = self._mark = 0  # the window's first token; where the last whole push ended
        self._sent = 0  # characters of the window's text already sent

    def push(self, tokens: Sequence[int]) -> list[int]:
        if isinstance(self._decoder, ByteDecoder):
            return list(tokens)
        self._tokens.extend(int(t) for t in tokens)
        text = self._decoder.decode(self._tokens[self._start :])
        held = len(self._tokens) < self._total and text.endswith(_REPLACEMENT_CHAR)
        ready = text[: -len(_REPLACEMENT_CHAR)] if held else text
        new, self._sent = ready[self._sent :], max(self._sent, len(ready))
        if not held:  # all sent: the next window starts where this push's context began
            self._start, self._mark = self._mark, len(self._tokens)
            self._sent = len(self._decoder.decode(self._tokens[self._start :]))
        return list(new.encode("utf-8"))
