"""Hugging Face Llama checkpoints in and out for the presets (:mod:`raytpu.presets`).

Glossary:

- **HF folder**: what ``save_pretrained`` writes and the Hub holds: ``config.json`` (the preset),
  ``model.safetensors`` or shards ``model-0000i-of-0000n.safetensors`` with
  ``model.safetensors.index.json`` (the weights), ``tokenizer.json`` (+ ``tokenizer_config.json``,
  ``generation_config.json``). Local or ``gs://BUCKET/PATH``: a ``gs://`` folder is read through
  gcsfs (the one native client of :mod:`workloads.storage`), each file downloaded once into a
  local cache (``$RAYTPU_HF_CACHE``, default ``~/.cache/raytpu/hf``) and memory-mapped from there;
  an export to ``gs://`` is written locally, then uploaded. Nothing is read from the Hub.
- **PT layout**: PyTorch's ``nn.Linear`` weights ``(out, in)`` under ``...q_proj.weight``
  (safetensors metadata ``{"format": "pt"}``): the Hub's, vLLM's and transformers' format, and
  what :func:`export` writes. **Flax layout**: transformers' ``FlaxLlamaForCausalLM``
  ``save_pretrained``, kernels ``(in, out)`` under ``...kernel`` / ``...embedding`` (``"flax"``);
  read only. A file's metadata ``format`` tells them apart, else its key suffixes.
- **our layout**: :class:`workloads.model.llama.LlamaLM`'s tree: q/k/v ``(d_model, heads,
  head_dim)``, o ``(heads, head_dim, d_model)``, dense ``(in, out)``, fp32. RoPE is HF's
  half-split (``rotate_half``) form, so q and k need no permutation.
- **weight table**: :data:`hf_weights.WEIGHTS`, one row per parameter (our path, PT key, Flax key, layout
  kind); it drives loading, the key and shape checks, and export.
- **slice read**: with ``shardings`` each parameter is built by ``jax.make_array_from_callback``
  and each device's callback reads only its block through safetensors' ``get_slice`` (a PT kernel
  block ``[i0:i1, o0:o1]`` is ``W[o0:o1, i0:i1].T``), so no host holds the whole model.

jax and safetensors are imported inside the functions: the driver reads a folder's preset
(:func:`read_preset`) without them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from raytpu.errors import invalid
from raytpu.presets import Preset, PresetError
from workloads.model import hf_files, hf_weights
from workloads.storage import join

CONFIG = "config.json"
TOKENIZER = "tokenizer.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
"""Keys of old checkpoints that are buffers, not parameters (RoPE's frequencies, recomputed)."""


# --- config.json <-> Preset ---------------------------------------------------------------

FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("vocab_size", "vocab_size", None),
    ("hidden_size", "d_model", None),
    ("num_hidden_layers", "n_layers", None),
    ("num_attention_heads", "n_heads", None),
    ("num_key_value_heads", "n_kv_heads", None),
    ("intermediate_size", "d_ff", None),
    ("max_position_embeddings", "seq_len", None),
    ("rope_theta", "rope_theta", 10_000.0),
    ("rms_norm_eps", "rms_norm_eps", 1e-6),
    ("tie_word_embeddings", "tie_embeddings", False),
)
"""(config.json key, Preset field, default: None = required; LlamaConfig's defaults otherwise).
``num_key_value_heads`` defaults to ``num_attention_heads`` (LlamaConfig's rule)."""


def _unsupported(c: Mapping[str, Any]) -> list[tuple[str, Any, str, bool]]:
    """(field, value, valid, ok) for what our model does not compute."""
    d, heads = c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    return [
        ("model_type", c.get("model_type"), "llama", c.get("model_type") == "llama"),
        ("rope_scaling", c.get("rope_scaling"), "null (plain RoPE)", c.get("rope_scaling") is None),
        ("hidden_act", c.get("hidden_act", "silu"), "silu", c.get("hidden_act", "silu") == "silu"),
        ("attention_bias", c.get("attention_bias"), "false", not c.get("attention_bias")),
        ("mlp_bias", c.get("mlp_bias"), "false", not c.get("mlp_bias")),
        ("hidden_size", d, f"a multiple of num_attention_heads ({heads})", d % heads == 0),
        (
            "head_dim",
            c.get("head_dim"),
            f"null or {d // heads} (hidden_size // num_attention_heads)",
            c.get("head_dim") in (None, d // heads),
        ),
        ("num_key_value_heads", kv, f"a divisor of num_attention_heads ({heads})", heads % kv == 0),
    ]


def preset_from_config(
    config: Mapping[str, Any], *, name: str, seq_len: int | None = None, where: str = CONFIG
) -> Preset:
    """A config.json's dict as a :class:`Preset` (``where``: its path, for errors)."""
    for hf, _, default in FIELDS:
        if default is None and hf != "num_key_value_heads" and config.get(hf) is None:
            raise PresetError(hf, None, "an integer >= 1", f"missing from {where}")
    for field, value, valid, ok in _unsupported(config):
        if not ok:
            raise PresetError(field, value, valid, f"in {where}: not what our Llama computes")
    values = {ours: config.get(hf, default) for hf, ours, default in FIELDS}
    values["n_kv_heads"] = values["n_kv_heads"] or values["n_heads"]
    stored = config.get("torch_dtype") or config.get("dtype")
    return Preset(
        name=name,
        vocab_size=int(values["vocab_size"]),
        d_model=int(values["d_model"]),
        n_layers=int(values["n_layers"]),
        n_heads=int(values["n_heads"]),
        n_kv_heads=int(values["n_kv_heads"]),
        d_ff=int(values["d_ff"]),
        seq_len=int(seq_len or values["seq_len"]),
        rope_theta=float(values["rope_theta"]),
        rms_norm_eps=float(values["rms_norm_eps"]),
        tie_embeddings=bool(values["tie_embeddings"]),
        dtype="float32" if stored == "float32" else "bfloat16",
        source=where,
    )


def read_preset(folder: str, *, seq_len: int | None = None, name: str | None = None) -> Preset:
    """The preset of an HF folder's config.json (``seq_len`` default: its
    ``max_position_embeddings``; ``name`` default: the folder's last path part; ``dtype``:
    float32 for a float32 checkpoint, else bfloat16). Refuses what our model does not compute."""
    path = hf_files.fetch(folder, CONFIG, required=True)
    config = json.loads(path.read_text())
    return preset_from_config(
        config, name=name or hf_files.last_part(folder), seq_len=seq_len, where=join(folder, CONFIG)
    )


def config_json(
    preset: Preset, *, dtype: str | None = None, special: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The config.json of ``preset`` (:func:`read_preset`'s inverse). ``dtype``: the stored
    weights' ``torch_dtype`` (default: the preset's); ``special``: ``bos_token_id`` and
    ``eos_token_id`` when known (:func:`special_tokens`)."""
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **{hf: getattr(preset, ours) for hf, ours, _ in FIELDS},
        "head_dim": preset.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "rope_scaling": None,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": dtype or preset.dtype,
    }
    config.update(dict(special or {}))
    return config


# --- tokenizer ------------------------------------------------------------------------------

SPECIAL_PAIRS = (
    ("<|begin_of_text|>", "<|end_of_text|>"),  # Llama 3
    ("<s>", "</s>"),  # Llama 2
    ("<|endoftext|>", "<|endoftext|>"),  # GPT-2 style, ours (workloads.data.text_data)
)
"""(bos, eos) token texts, first pair a tokenizer holds wins."""


def read_tokenizer(folder: str) -> str:
    """The text of the folder's tokenizer.json."""
    return hf_files.fetch(folder, TOKENIZER, required=True).read_text()


def special_tokens(tokenizer: str) -> dict[str, Any]:
    """``bos_token``/``eos_token`` texts and ``bos_token_id``/``eos_token_id`` of a tokenizer.json
    (by :data:`SPECIAL_PAIRS`); empty if it holds none of them."""
    raw = json.loads(tokenizer)
    ids = dict(raw.get("model", {}).get("vocab") or {})
    ids.update({t["content"]: t["id"] for t in raw.get("added_tokens", [])})
    for bos, eos in SPECIAL_PAIRS:
        if bos in ids and eos in ids:
            return {
                "bos_token": bos,
                "eos_token": eos,
                "bos_token_id": ids[bos],
                "eos_token_id": ids[eos],
            }
    return {}


def tokenizer_config(preset: Preset, tokenizer: str) -> dict[str, Any]:
    """tokenizer_config.json: transformers' ``PreTrainedTokenizerFast`` over tokenizer.json."""
    special = special_tokens(tokenizer)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": preset.seq_len,
        "clean_up_tokenization_spaces": False,
        **{k: v for k, v in special.items() if not k.endswith("_id")},
    }


def load_family(
    folder: str,
    *,
    seq_len: int | None = None,
    mesh_config: Any = None,
    hosts_per_slice: int = 1,
) -> Any:
    """The :class:`workloads.model.family.Llama` of an HF folder (its preset and tokenizer)."""
    from workloads.model.family import Llama

    return Llama(
        read_preset(folder, seq_len=seq_len),
        tokenizer=read_tokenizer(folder),
        mesh_config=mesh_config,
        hosts_per_slice=hosts_per_slice,
    )


# --- weights in -----------------------------------------------------------------------------


def open_weights(path: Path) -> Any:
    """The one place a safetensors file is opened (numpy, memory-mapped; a context manager)."""
    from safetensors import safe_open

    return safe_open(str(path), framework="numpy")


def _weight_files(folder: str) -> dict[str, Path]:
    """Key -> local file of every tensor of the folder (one file, or the index's shards)."""
    index = hf_files.fetch(folder, INDEX)
    if index is not None:
        weight_map = json.loads(index.read_text())["weight_map"]
        local = {
            name: hf_files.fetch(folder, name, required=True) for name in set(weight_map.values())
        }
        return {key: local[name] for key, name in weight_map.items()}
    single = hf_files.fetch(folder, SINGLE)
    if single is None:
        raise FileNotFoundError(
            invalid("folder", folder, f"a Hugging Face folder with {SINGLE} or {INDEX}")
        )
    with open_weights(single) as f:
        return dict.fromkeys(f.keys(), single)


def _layout(handle: Any, keys: list[str]) -> str:
    """``pt`` or ``flax``: the file's metadata ``format``, else its key suffixes."""
    fmt = (handle.metadata() or {}).get("format")
    if fmt in ("pt", "flax"):
        return fmt
    return "flax" if any(k.endswith((".kernel", ".embedding")) for k in keys) else "pt"


def _check_keys(
    folder: str,
    preset: Preset,
    layout: str,
    rows: list[hf_weights.Tensor],
    shapes: dict[str, tuple],
) -> None:
    """Missing, extra or mis-shaped hf_weights.tensors: an error naming the key, found and expected."""
    expected = {t.key(layout): hf_weights.file_shape(t.kind, layout, t.shape) for t in rows}
    where = f"{layout}-layout weights in {folder}, preset {preset.name}"
    for key, shape in expected.items():
        if key not in shapes:
            raise ValueError(
                invalid(
                    key, "absent", f"a tensor of shape {shape}", reason=f"missing from the {where}"
                )
            )
        if tuple(shapes[key]) != shape:
            raise ValueError(
                invalid(
                    key, f"shape {tuple(shapes[key])}", f"shape {shape}", reason=f"in the {where}"
                )
            )
    tied_head = {hf_weights.HEAD.key(layout)} if preset.tie_embeddings else set()
    for key, shape in shapes.items():
        if key not in expected and key not in tied_head and not key.endswith(IGNORED_SUFFIXES):
            raise ValueError(
                invalid(
                    key,
                    f"shape {tuple(shape)}",
                    f"no such tensor in a Llama of this preset (keys like {rows[0].key(layout)!r})",
                    reason=f"an extra tensor in the {where}",
                )
            )


def load_params(folder: str, preset: Preset, shardings: Any = None) -> Any:
    """The folder's weights (PT or Flax layout, one file or sharded) in our layout, fp32.

    ``shardings``: a tree of ``NamedSharding`` like the params (``sharding.state_shardings(
    preset, mesh).params``) or one sharding for all; each device's callback then reads only
    its block. Without it: whole arrays on the default device."""
    import jax

    files = _weight_files(folder)
    rows = hf_weights.tensors(preset)
    with ExitStack() as stack:
        handles = {p: stack.enter_context(open_weights(p)) for p in sorted(set(files.values()))}
        shapes = {k: tuple(handles[p].get_slice(k).get_shape()) for k, p in files.items()}
        layout = _layout(handles[next(iter(files.values()))], list(files))
        _check_keys(folder, preset, layout, rows, shapes)
        params: dict[str, Any] = {}
        for row in rows:
            key = row.key(layout)

            def block(index: Any, row: hf_weights.Tensor = row, key: str = key) -> np.ndarray:
                bounds = [s.indices(n)[:2] for s, n in zip(index, row.shape, strict=True)]
                part = handles[files[key]].get_slice(key)
                raw = hf_weights.read_block(row.kind, layout, part, bounds, preset.head_dim)
                return np.ascontiguousarray(raw, dtype=np.float32)

            sharding = _sharding_of(shardings, row.path)
            if sharding is None:
                leaf = jax.device_put(block(tuple(slice(None) for _ in row.shape)))
            else:
                leaf = jax.make_array_from_callback(row.shape, sharding, block)
            _put(params, row.path, leaf)
    return params


def _sharding_of(shardings: Any, path: tuple[str, ...]) -> Any:
    import jax

    if shardings is None or isinstance(shardings, jax.sharding.Sharding):
        return shardings
    for part in path:
        shardings = shardings[part]
    return shardings


def _put(tree: dict[str, Any], path: tuple[str, ...], leaf: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = leaf


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree.unbox() if hasattr(tree, "unbox") else tree


# --- weights out ----------------------------------------------------------------------------


def _host_array(leaf: Any) -> np.ndarray:
    """One parameter on this host, whole (gathered over processes if it spans them)."""
    import jax
    from jax.experimental import multihost_utils

    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(jax.device_get(leaf))


def export(
    folder: str,
    preset: Preset,
    params: Any,
    tokenizer: str,
    *,
    dtype: str = "bfloat16",
    max_shard_bytes: int = 5 * 2**30,
) -> list[str]:
    """Write an HF folder (PT-layout safetensors, sharded with an index past
    ``max_shard_bytes``; config.json, generation_config.json, tokenizer.json,
    tokenizer_config.json) of ``params`` (our layout); the files written. Each parameter is
    gathered on its own (a collective when it spans processes: every process calls this); only
    process 0 writes (the others return ``[]``)."""
    import jax

    itemsize = np.dtype(hf_files.numpy_dtype(dtype)).itemsize
    rows = hf_weights.tensors(preset)
    for row in rows:
        found = tuple(np.shape(_get(params, row.path)))
        if found != row.shape:
            raise ValueError(
                invalid(
                    "/".join(row.path),
                    f"shape {found}",
                    f"shape {row.shape}",
                    reason=f"params of preset {preset.name}",
                )
            )
    shards = hf_files.shard_plan(rows, itemsize, max_shard_bytes)
    names = (
        [SINGLE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    writer = jax.process_index() == 0
    with hf_files.target(folder, writer) as local:
        written = []
        for name, group in zip(names, shards, strict=True):
            arrays = (
                hf_weights.to_pt(row.kind, _host_array(_get(params, row.path))) for row in group
            )
            entries = [
                (row.key("pt"), hf_weights.file_shape(row.kind, "pt", row.shape)) for row in group
            ]
            if not writer:
                for _ in arrays:
                    pass
                continue
            hf_files.write_safetensors(local / name, entries, dtype, arrays)
            written.append(name)
        if not writer:
            return []
        if len(shards) > 1:
            weight_map = {
                row.key("pt"): name for name, g in zip(names, shards, strict=True) for row in g
            }
            total = sum(int(np.prod(r.shape)) * itemsize for r in rows)
            _write_json(
                local / INDEX, {"metadata": {"total_size": total}, "weight_map": weight_map}
            )
            written.append(INDEX)
        written += _write_side_files(local, preset, tokenizer, dtype)
    return [join(folder, name) for name in written]


def _write_side_files(local: Path, preset: Preset, tokenizer: str, dtype: str) -> list[str]:
    special = special_tokens(tokenizer)
    ids = {k: v for k, v in special.items() if k.endswith("_id")}
    files = {
        CONFIG: config_json(preset, dtype=dtype, special=ids),
        "generation_config.json": {"_from_model_config": True, **ids},
        "tokenizer_config.json": tokenizer_config(preset, tokenizer),
    }
    for name, content in files.items():
        _write_json(local / name, content)
    (local / TOKENIZER).write_text(tokenizer)
    return [*files, TOKENIZER]


def _write_json(path: Path, content: Any) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def export_checkpoint(
    checkpoint_dir: str, folder: str, *, step: int | None = None, dtype: str = "bfloat16"
) -> list[str]:
    """Export an Orbax run checkpoint of a preset (its latest step, or ``step``) as an HF
    folder (:func:`export`); the files written."""
    from workloads.model.checkpoint import restore_params
    from workloads.model.family import Llama

    params, family, _ = restore_params(checkpoint_dir, step)
    if not isinstance(family, Llama):
        raise ValueError(
            invalid(
                "checkpoint_dir",
                checkpoint_dir,
                "a checkpoint of a Llama preset",
                reason=f"it holds a {family.name} model",
            )
        )
    return export(folder, family.preset, params, family.tokenizer, dtype=dtype)


# --- local and gs:// folders ----------------------------------------------------------------
