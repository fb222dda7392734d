"""The reference Llama the Hugging Face tests compare with: transformers' own Flax Llama
(``FlaxLlamaForCausalLM``, no torch), tiny and random (the ``tiny`` preset's shape, its norm
scales randomized too so that a swapped norm shows), saved with ``save_pretrained`` beside a
tokenizer.json trained on the shipped corpus."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np

from raytpu.presets import Preset
from workloads.data.corpus import load_corpus
from workloads.data.text_data import tokenizer_json
from workloads.model import hf_llama

REFERENCE_CONFIG = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)


@dataclasses.dataclass(frozen=True)
class Reference:
    folder: Path
    model: Any
    tokenizer: str

    @property
    def preset(self) -> Preset:
        """The folder's preset, computing in fp32 (parity)."""
        return dataclasses.replace(hf_llama.read_preset(str(self.folder)), dtype="float32")

    def generate(self, prompt: list[int], new_tokens: int) -> list[int]:
        """transformers' greedy continuation of the token ids ``prompt``."""
        out = self.model.generate(
            np.asarray([prompt], np.int32),
            attention_mask=np.ones((1, len(prompt)), np.int32),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
        return [int(t) for t in out.sequences[0, len(prompt) :]]


def make_reference(folder: Path) -> Reference:
    """A new random reference model saved in ``folder`` with its tokenizer."""
    from transformers import FlaxLlamaForCausalLM, LlamaConfig

    model = FlaxLlamaForCausalLM(LlamaConfig(**REFERENCE_CONFIG), seed=0)
    rng = np.random.default_rng(0)

    def randomize(path: Any, leaf: Any) -> Any:
        if path[-1].key == "weight":  # RMSNorm scales: ones from the initializer
            return leaf + 0.2 * rng.standard_normal(leaf.shape).astype(np.float32)
        return leaf

    model.params = jax.tree_util.tree_map_with_path(randomize, model.params)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer = tokenizer_json(load_corpus(), REFERENCE_CONFIG["vocab_size"])
    (folder / hf_llama.TOKENIZER).write_text(tokenizer)
    return Reference(folder, model, tokenizer)
