"""Hugging Face Llama folders in and out (workloads.model.hf_llama), against transformers.

The reference is transformers' own Flax Llama (``FlaxLlamaForCausalLM``, no torch): a tiny random
one (the ``tiny`` preset's shape, its norm scales randomized too so that a swapped norm shows),
saved with ``save_pretrained`` (Flax-layout safetensors) beside a tokenizer.json trained on the
shipped corpus. Measured on this machine: fp32 logits within 2.4e-7 of transformers' (tolerance
1e-4), bf16 compute within 3.9e-3 (tolerance 3e-2; logits up to 0.63). The sharded load runs in a
child process with 8 CPU devices (``--xla_force_host_platform_device_count``: the test process
has one).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gcs_fixture import gcs_or_skip
from hf_reference import REFERENCE_CONFIG, Reference, make_reference

from raytpu.presets import PRESETS, Preset, PresetError
from workloads.data.corpus import load_corpus
from workloads.model import hf_files, hf_llama, hf_weights, llama
from workloads.model.family import Llama

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)

PROMPT = "The old teacher walked to the"
NEW_TOKENS = 12
BUCKET = "raytpu-hf-test"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    return make_reference(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="module")
def params(reference):
    return hf_llama.load_params(str(reference.folder), reference.preset)


@pytest.fixture(scope="module")
def tokens(reference) -> np.ndarray:
    ids = Llama(reference.preset, reference.tokenizer).encode(load_corpus()[:4000])
    return np.asarray(ids[: 2 * 48], np.int32).reshape(2, 48)


def ours_logits(preset: Preset, params: Any, tokens: np.ndarray) -> np.ndarray:
    return np.asarray(llama.LlamaLM(preset).apply({"params": params}, tokens)[0])


def same_arrays(a: Any, b: Any) -> bool:
    equal = jax.tree.map(lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)
    return jax.tree.structure(a) == jax.tree.structure(b) and all(jax.tree.leaves(equal))


def test_read_preset_gives_the_reference_shape(reference):
    preset = hf_llama.read_preset(str(reference.folder))
    tiny = PRESETS["tiny"]
    assert preset == dataclasses.replace(tiny, name="tiny-llama", source=preset.source)
    assert preset.source == str(reference.folder / "config.json")
    assert hf_llama.read_preset(str(reference.folder), seq_len=32, name="x").seq_len == 32


@pytest.mark.parametrize(
    ("dtype", "atol"), [("float32", 1e-4), ("bfloat16", 3e-2)], ids=["fp32", "bf16"]
)
def test_logits_match_transformers(reference, params, tokens, dtype, atol):
    theirs = np.asarray(reference.model(tokens).logits)
    ours = ours_logits(dataclasses.replace(reference.preset, dtype=dtype), params, tokens)
    diff = float(np.abs(ours - theirs).max())
    print(f"{dtype}: max |logit diff| {diff:.2e}, max |logit| {np.abs(theirs).max():.3f}")
    assert diff <= atol


def test_greedy_decoding_matches_transformers_generate(reference, params):
    family = Llama(reference.preset, reference.tokenizer)
    prompt = family.encode(PROMPT)
    step = jax.jit(family.next_logits)
    row = np.zeros((1, reference.preset.seq_len), np.int32)
    row[0, : len(prompt)] = prompt
    for n in range(NEW_TOKENS):
        length = len(prompt) + n
        row[0, length] = int(jnp.argmax(step(params, row, jnp.array([length]))[0]))
    ours = row[0, len(prompt) : len(prompt) + NEW_TOKENS].tolist()
    theirs = reference.generate(prompt, NEW_TOKENS)
    assert ours == theirs
    assert len(set(ours)) > 1, "a constant continuation would not tell the models apart"


@pytest.fixture(scope="module")
def exported(reference, params, tmp_path_factory) -> Path:
    """Our PT-layout export (fp32, one file) of the reference's weights."""
    folder = tmp_path_factory.mktemp("export") / "tiny-llama"
    hf_llama.export(str(folder), reference.preset, params, reference.tokenizer, dtype="float32")
    return folder


def test_transformers_reads_our_export(reference, exported, tokens):
    from safetensors import safe_open
    from transformers import FlaxLlamaForCausalLM

    with safe_open(str(exported / "model.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_slice("model.layers.0.self_attn.o_proj.weight").get_shape() == [64, 64]
        assert f.get_slice("model.layers.0.self_attn.k_proj.weight").get_shape() == [32, 64]
    theirs = np.asarray(FlaxLlamaForCausalLM.from_pretrained(exported)(tokens).logits)
    expected = np.asarray(reference.model(tokens).logits)
    assert float(np.abs(theirs - expected).max()) <= 1e-6


@pytest.mark.parametrize("loader", ["PreTrainedTokenizerFast", "AutoTokenizer"])
def test_transformers_tokenizer_loads_our_export(reference, exported, loader):
    import transformers

    tokenizer = getattr(transformers, loader).from_pretrained(exported)
    ours = Llama(reference.preset, reference.tokenizer)
    text = load_corpus()[:200]
    assert tokenizer(text)["input_ids"] == ours.encode(text)
    assert tokenizer.eos_token == "<|endoftext|>"
    assert (
        tokenizer.eos_token_id == json.loads((exported / "config.json").read_text())["eos_token_id"]
    )


def tied_preset() -> Preset:
    return dataclasses.replace(PRESETS["tiny"], tie_embeddings=True, dtype="float32")


@pytest.mark.parametrize(
    ("tied", "max_shard_bytes", "files"),
    [(False, 5 * 2**30, 1), (False, 160 * 1024, 4), (True, 5 * 2**30, 1)],
    ids=["one-file", "sharded", "tied"],
)
def test_export_then_load_is_exact_in_fp32(
    reference, params, tmp_path, tied, max_shard_bytes, files
):
    preset = tied_preset() if tied else reference.preset
    source = llama.init_state(preset, jax.random.PRNGKey(1)).params if tied else params
    source = jax.tree.map(np.asarray, nn.meta.unbox(source))
    folder = tmp_path / "out"
    written = hf_llama.export(
        str(folder),
        preset,
        source,
        reference.tokenizer,
        dtype="float32",
        max_shard_bytes=max_shard_bytes,
    )
    weights = sorted(folder.glob("*.safetensors"))
    assert len(weights) == files
    assert all(p.stat().st_size <= max_shard_bytes + 4096 for p in weights)  # + the header
    assert (folder / "model.safetensors.index.json").is_file() == (files > 1)
    assert sorted(Path(p).name for p in written) == sorted(p.name for p in folder.iterdir())
    back = hf_llama.read_preset(str(folder), name=preset.name)
    assert back == dataclasses.replace(preset, source=back.source)
    assert same_arrays(hf_llama.load_params(str(folder), back), source)


def test_bf16_export_rounds_each_weight_once(reference, params, tmp_path):
    import ml_dtypes

    hf_llama.export(str(tmp_path), reference.preset, params, reference.tokenizer)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    back = hf_llama.load_params(str(tmp_path), reference.preset)
    rounded = jax.tree.map(lambda x: np.asarray(x).astype(ml_dtypes.bfloat16), params)
    assert same_arrays(jax.tree.map(lambda x: x.astype(np.float32), rounded), back)


class CountingReads:
    """``hf_llama.open_weights`` wrapped: the elements of every block read through
    ``get_slice``, per tensor key."""

    def __init__(self, opener: Any) -> None:
        self.opener = opener
        self.reads: dict[str, list[int]] = defaultdict(list)

    def __call__(self, path: Path) -> Any:
        return _Handle(self.opener(path), self.reads)


class _Handle:
    def __init__(self, handle: Any, reads: dict[str, list[int]]) -> None:
        self.handle, self.reads = handle, reads

    def __enter__(self) -> _Handle:
        self.handle.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def get_slice(self, key: str) -> Any:
        return _Slice(self.handle.get_slice(key), self.reads[key])


class _Slice:
    def __init__(self, part: Any, reads: list[int]) -> None:
        self.part, self.reads = part, reads

    def get_shape(self) -> list[int]:
        return self.part.get_shape()

    def __getitem__(self, index: Any) -> np.ndarray:
        block = self.part[index]
        self.reads.append(int(block.size))
        return block


@pytest.fixture
def counted(monkeypatch) -> CountingReads:
    counting = CountingReads(hf_llama.open_weights)
    monkeypatch.setattr(hf_llama, "open_weights", counting)
    return counting


def test_a_load_without_shardings_reads_each_weight_once(reference, counted):
    preset = reference.preset
    hf_llama.load_params(str(reference.folder), preset)
    sizes = {t.key("flax"): int(np.prod(t.shape)) for t in hf_weights.tensors(preset)}
    assert dict(counted.reads) == {key: [size] for key, size in sizes.items()}


CHILD = r"""
import json, sys
import jax, numpy as np, pytest
from raytpu.presets import MeshConfig, Preset
from workloads.model import hf_llama, hf_weights, sharding
from test_hf_llama import CountingReads

preset = Preset(**json.loads(sys.argv[1]))
mesh = sharding.build_mesh(MeshConfig(ici_fsdp=4, ici_tensor=2))
shardings = sharding.state_shardings(preset, mesh).params
report = {"devices": jax.device_count(), "folders": {}}
for folder in sys.argv[2:]:
    whole = hf_llama.load_params(folder, preset)
    with pytest.MonkeyPatch.context() as patch:
        counting = CountingReads(hf_llama.open_weights)
        patch.setattr(hf_llama, "open_weights", counting)
        sharded = hf_llama.load_params(folder, preset, shardings)
    tensors = {}
    for row in hf_weights.tensors(preset):
        leaf, full = sharded, whole
        for part in row.path:
            leaf, full = leaf[part], full[part]
        tensors[row.key("pt")] = {
            "size": int(np.prod(row.shape)),
            "shard": int(leaf.addressable_shards[0].data.size),
            "reads": [n for key in {row.key("pt"), row.key("flax")} for n in counting.reads[key]],
            "equal": bool(np.array_equal(np.asarray(leaf), np.asarray(full))),
        }
    report["folders"][folder] = tensors
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def sharded_load(reference, params, tmp_path_factory) -> dict[str, Any]:
    """The child's report of a sharded load (8 devices, fsdp 4 x tensor 2) of the reference's
    Flax-layout folder and of our sharded PT-layout export."""
    pt = tmp_path_factory.mktemp("sharded") / "tiny-llama"
    preset = reference.preset
    hf_llama.export(
        str(pt), preset, params, reference.tokenizer, dtype="float32", max_shard_bytes=64 * 1024
    )
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(preset.to_dict()), str(reference.folder), str(pt)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["devices"] == 8
    return report


@pytest.mark.parametrize("layout", ["flax", "pt"], ids=["transformers-flax", "our-pt-sharded"])
def test_a_sharded_load_reads_only_each_devices_slice(sharded_load, layout):
    [flax_folder, pt_folder] = sharded_load["folders"].values()
    tensors = flax_folder if layout == "flax" else pt_folder
    assert len(tensors) == len(hf_weights.tensors(PRESETS["tiny"]))
    for key, entry in tensors.items():
        assert entry["equal"], key
        assert entry["reads"] == [entry["shard"]] * 8, key  # one block per device, no more
        matrix = not key.endswith("norm.weight")
        assert entry["shard"] * (8 if matrix else 4) == entry["size"], key


def write_config(folder: Path, **changes: Any) -> None:
    config = {"model_type": "llama", **REFERENCE_CONFIG}
    config.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v != ...}))


BAD_CONFIGS = [
    ("model_type", "mistral", "valid: llama"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "valid: null"),
    ("hidden_act", "gelu", "valid: silu"),
    ("attention_bias", True, "valid: false"),
    ("mlp_bias", True, "valid: false"),
    ("head_dim", 32, "valid: null or 16"),
    ("num_key_value_heads", 3, "valid: a divisor of num_attention_heads (4)"),
    ("hidden_size", 66, "valid: a multiple of num_attention_heads (4)"),
    ("intermediate_size", ..., "valid: an integer >= 1"),
]


@pytest.mark.parametrize(
    ("field", "value", "valid"), BAD_CONFIGS, ids=[f"{f}-{v}" for f, v, _ in BAD_CONFIGS]
)
def test_a_config_our_model_does_not_compute_is_refused(tmp_path, field, value, valid):
    write_config(tmp_path, **{field: value})
    with pytest.raises(PresetError) as caught:
        hf_llama.read_preset(str(tmp_path))
    shown = None if value is ... else value
    assert (caught.value.field, caught.value.value) == (field, shown)
    assert f"{field}: {shown!r} is not valid" in str(caught.value)
    assert valid in str(caught.value)
    assert str(tmp_path / "config.json") in str(caught.value)


def break_weights(folder: Path, change: str) -> None:
    from safetensors.numpy import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    if change == "missing":
        del tensors["model.norm.weight"]
    elif change == "extra":
        tensors["model.layers.2.mlp.up_proj.weight"] = np.zeros((128, 64), np.float32)
    else:
        tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((96, 64), np.float32)
    save_file(tensors, str(path), metadata={"format": "pt"})


BAD_WEIGHTS = [
    ("missing", "model.norm.weight: 'absent' is not valid", "valid: a tensor of shape (64,)"),
    (
        "extra",
        "model.layers.2.mlp.up_proj.weight: 'shape (128, 64)' is not valid",
        "valid: no such tensor",
    ),
    (
        "shape",
        "model.layers.1.mlp.up_proj.weight: 'shape (96, 64)' is not valid",
        "valid: shape (128, 64)",
    ),
]


@pytest.mark.parametrize(
    ("change", "found", "expected"), BAD_WEIGHTS, ids=[b[0] for b in BAD_WEIGHTS]
)
def test_weights_that_do_not_fit_the_preset_are_named(
    reference, exported, tmp_path, change, found, expected
):
    for path in exported.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    break_weights(tmp_path, change)
    with pytest.raises(ValueError) as caught:
        hf_llama.load_params(str(tmp_path), reference.preset)
    assert found in str(caught.value) and expected in str(caught.value)


@pytest.mark.parametrize("name", ["tokenizer.json", "config.json"])
def test_a_missing_file_is_named(tmp_path, name):
    read = hf_llama.read_tokenizer if name == "tokenizer.json" else hf_llama.read_preset
    with pytest.raises(FileNotFoundError) as caught:
        read(str(tmp_path))
    assert f"folder: {str(tmp_path)!r} is not valid (no {tmp_path / name})" in str(caught.value)
    assert f"valid: a Hugging Face folder with {name}" in str(caught.value)


def test_export_checkpoint_exports_an_orbax_run(reference, params, tmp_path):
    import orbax.checkpoint as ocp

    from workloads.model.checkpoint import orbax_path, save_state

    family = Llama(reference.preset, reference.tokenizer)
    state = llama.TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=llama.optimizer().init(params)
    )
    manager = ocp.CheckpointManager(orbax_path(str(tmp_path / "run")))
    save_state(manager, 3, state, family)
    manager.wait_until_finished()
    manager.close()
    written = hf_llama.export_checkpoint(
        str(tmp_path / "run"), str(tmp_path / "hf"), dtype="float32"
    )
    assert str(tmp_path / "hf" / "model.safetensors") in written
    loaded = hf_llama.load_family(str(tmp_path / "hf"))
    assert loaded.tokenizer == reference.tokenizer
    assert same_arrays(hf_llama.load_params(str(tmp_path / "hf"), loaded.preset), params)


def test_a_gs_folder_exports_and_loads_on_the_emulator(reference, params, tmp_path, monkeypatch):
    monkeypatch.setenv(hf_files.CACHE_ENV, str(tmp_path / "cache"))
    folder = f"gs://{BUCKET}/models/tiny-llama"
    with gcs_or_skip(BUCKET) as gcs:
        written = hf_llama.export(
            str(folder),
            reference.preset,
            params,
            reference.tokenizer,
            dtype="float32",
            max_shard_bytes=64 * 1024,
        )
        objects = gcs.objects(BUCKET, "models/tiny-llama/")
        assert sorted(objects) == sorted(p.removeprefix(f"gs://{BUCKET}/") for p in written)
        family = hf_llama.load_family(folder)
        assert family.preset == dataclasses.replace(
            reference.preset, name="tiny-llama", source=f"{folder}/config.json"
        )
        assert family.tokenizer == reference.tokenizer
        assert same_arrays(hf_llama.load_params(folder, family.preset), params)
        cached = sorted(
            p.name for p in (tmp_path / "cache" / BUCKET / "models" / "tiny-llama").glob("*")
        )
        assert [n for n in cached if n.endswith(".safetensors")] == sorted(
            Path(o).name for o in objects if o.endswith(".safetensors")
        )
