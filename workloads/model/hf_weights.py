"""The weight table of a Hugging Face Llama folder (:mod:`workloads.model.hf_llama`): one row
per parameter (our path, its PyTorch-layout key, its Flax-layout key, its layout kind), each
preset's tensors in file order, and the layout conversions between the files and our tree.

numpy only: the driver reads a folder's preset without jax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from raytpu.presets import Preset


@dataclass(frozen=True)
class Weight:
    """One parameter: our path (``{i}``: the layer), its PT key, its Flax key, its layout kind
    and our shape (preset attribute names). Kinds: ``same`` (identical everywhere), ``dense``
    (ours and Flax ``(in, out)``, PT ``(out, in)``), ``heads_in`` (q/k/v: ours ``(d, h, hd)``,
    Flax ``(d, h*hd)``, PT ``(h*hd, d)``), ``heads_out`` (o: ours ``(h, hd, d)``, Flax
    ``(h*hd, d)``, PT ``(d, h*hd)``)."""

    ours: str
    pt: str
    flax: str
    kind: str
    dims: tuple[str, ...]

    def key(self, layout: str) -> str:
        return self.pt if layout == "pt" else self.flax

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.ours


def _layer(ours: str, hf: str, kind: str, *dims: str) -> Weight:
    suffix = "weight" if kind == "same" else "kernel"
    prefix = "model.layers.{i}."
    return Weight(
        f"layer_{{i}}/{ours}", f"{prefix}{hf}.weight", f"{prefix}{hf}.{suffix}", kind, dims
    )


D, H, KV, HD, FF, V = "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab_size"
WEIGHTS: tuple[Weight, ...] = (
    Weight("embed/embedding", "model.embed_tokens.weight", "model.embed_tokens.embedding", "same",
           (V, D)),
    _layer("attention_norm/scale", "input_layernorm", "same", D),
    _layer("attention/q/kernel", "self_attn.q_proj", "heads_in", D, H, HD),
    _layer("attention/k/kernel", "self_attn.k_proj", "heads_in", D, KV, HD),
    _layer("attention/v/kernel", "self_attn.v_proj", "heads_in", D, KV, HD),
    _layer("attention/o/kernel", "self_attn.o_proj", "heads_out", H, HD, D),
    _layer("mlp_norm/scale", "post_attention_layernorm", "same", D),
    _layer("mlp/gate/kernel", "mlp.gate_proj", "dense", D, FF),
    _layer("mlp/up/kernel", "mlp.up_proj", "dense", D, FF),
    _layer("mlp/down/kernel", "mlp.down_proj", "dense", FF, D),
    Weight("final_norm/scale", "model.norm.weight", "model.norm.weight", "same", (D,)),
    Weight("head/kernel", "lm_head.weight", "lm_head.kernel", "dense", (D, V)),
)  # fmt: skip
HEAD = WEIGHTS[-1]


@dataclass(frozen=True)
class Tensor:
    """A :class:`Weight` row of one layer of a preset, with our shape."""

    weight: Weight
    path: tuple[str, ...]
    shape: tuple[int, ...]
    layer: int | None

    def key(self, layout: str) -> str:
        return self.weight.key(layout).replace("{i}", str(self.layer))

    @property
    def kind(self) -> str:
        return self.weight.kind


def tensors(preset: Preset) -> list[Tensor]:
    """Every parameter of ``preset`` in file order: the embedding, layer by layer, the final
    norm and the head (only if untied)."""
    glob = [w for w in WEIGHTS if not w.per_layer and not (w is HEAD and preset.tie_embeddings)]
    order = [(glob[0], None)]
    order += [(w, i) for i in range(preset.n_layers) for w in WEIGHTS if w.per_layer]
    order += [(w, None) for w in glob[1:]]
    return [
        Tensor(
            weight=w,
            path=tuple(w.ours.replace("{i}", str(i)).split("/")),
            shape=tuple(int(getattr(preset, dim)) for dim in w.dims),
            layer=i,
        )
        for w, i in order
    ]


def file_shape(kind: str, layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tensor of our ``shape`` has in a file of ``layout``."""
    if kind == "same" or (kind == "dense" and layout == "flax"):
        return shape
    if kind == "dense":
        return shape[::-1]
    if kind == "heads_in":
        flax = (shape[0], shape[1] * shape[2])
    else:
        flax = (shape[0] * shape[1], shape[2])
    return flax if layout == "flax" else flax[::-1]


def read_block(kind: str, layout: str, part: Any, bounds: list[tuple[int, int]], hd: int) -> Any:
    """Our block ``bounds`` (``(start, stop)`` per our axis) of a tensor, reading only that block
    of the file's tensor ``part`` (a safetensors slice; ``hd``: head_dim)."""
    whole = tuple(slice(a, b) for a, b in bounds)
    if kind == "same" or (kind == "dense" and layout == "flax"):
        return part[whole]
    if kind == "dense":
        (i0, i1), (o0, o1) = bounds
        return part[o0:o1, i0:i1].T
    if kind == "heads_in":
        (d0, d1), (h0, h1), (e0, e1) = bounds
        heads = slice(h0 * hd, h1 * hd)
        if layout == "flax":
            block = part[d0:d1, heads].reshape(d1 - d0, h1 - h0, hd)
        else:
            block = part[heads, d0:d1].reshape(h1 - h0, hd, d1 - d0).transpose(2, 0, 1)
        return block[:, :, e0:e1]
    (h0, h1), (e0, e1), (d0, d1) = bounds
    heads = slice(h0 * hd, h1 * hd)
    if layout == "flax":
        block = part[heads, d0:d1].reshape(h1 - h0, hd, d1 - d0)
    else:
        block = part[d0:d1, heads].reshape(d1 - d0, h1 - h0, hd).transpose(1, 2, 0)
    return block[:, e0:e1, :]


def to_pt(kind: str, array: np.ndarray) -> np.ndarray:
    """Our array as the PT-layout tensor."""
    if kind == "same":
        return array
    if kind == "heads_in":
        return array.reshape(array.shape[0], -1).T
    if kind == "heads_out":
        return array.reshape(-1, array.shape[-1]).T
    return array.T
