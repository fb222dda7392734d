"""Preset arithmetic against the public configs they mirror, the mesh rules and the HBM refusal."""

from __future__ import annotations

import pytest

from raytpu import catalog
from raytpu.presets import (
    GIB,
    PRESETS,
    MeshConfig,
    PresetError,
    check_fits,
    memory_per_chip,
    preset,
)


@pytest.mark.parametrize(
    ("name", "published", "rounded"),
    [("1b", 1_235_814_400, "1.24B"), ("8b", 8_030_261_248, "8.03B")],
    ids=["llama-3.2-1b", "llama-3.1-8b"],
)
def test_parameter_count_matches_the_published_model(name, published, rounded):
    model = preset(name)
    assert model.params == published
    assert model.published_params == published
    assert f"{model.params / 1e9:.2f}B" == rounded


def test_flops_per_token_is_six_times_matmul_params_plus_causal_attention():
    model = preset("8b")
    # Embedding lookup excluded, output head included: 8.03B - 0.525B (input embedding) - norms.
    assert model.matmul_params == model.params - model.vocab_size * model.d_model - (
        (2 * model.n_layers + 1) * model.d_model
    )
    attention = 6 * model.n_layers * 8192 * model.d_model
    assert model.train_flops_per_token(8192) == pytest.approx(6 * model.matmul_params + attention)
    # MaxText's figure for Llama 3.1 8B at seq 8192 is ~5.5e10 FLOPs per token (order check).
    assert 4.5e10 < model.train_flops_per_token(8192) < 6.0e10


def test_fsdp_shards_the_state_one_nth_per_chip():
    model = preset("8b")
    one = memory_per_chip(model, MeshConfig(ici_fsdp=1))
    sixteen = memory_per_chip(model, MeshConfig(ici_fsdp=16))
    assert one.state_bytes == pytest.approx(16 * model.params)
    assert sixteen.state_bytes == pytest.approx(one.state_bytes / 16)


@pytest.mark.parametrize(
    ("name", "generation", "topology", "mesh", "fits"),
    [
        ("8b", "v6e", "4x4", MeshConfig(ici_fsdp=16), True),
        ("8b", "v5e", "2x4", MeshConfig(ici_fsdp=8), False),
        ("8b", "v6e", "2x2", MeshConfig(ici_fsdp=4), False),
        ("1b", "v5e", "2x4", MeshConfig(ici_fsdp=8), True),
        ("1b", "v5e", "1x1", MeshConfig(), False),
        ("tiny", "v5e", "1x1", MeshConfig(), True),
    ],
    ids=["8b-v6e-16", "8b-v5e-8", "8b-v6e-4", "1b-v5e-8", "1b-v5e-1", "tiny-v5e-1"],
)
def test_hbm_check(name, generation, topology, mesh, fits):
    machine = "ct5lp-hightpu-4t" if (generation, topology) == ("v5e", "2x4") else None
    shape = catalog.shape(generation, topology, machine_type=machine)
    model = preset(name)
    if fits:
        estimate = check_fits(model, shape, mesh)
        assert estimate.total_bytes <= shape.generation.hbm_gib * GIB
        return
    need = memory_per_chip(model, mesh).total_bytes / GIB
    with pytest.raises(PresetError) as caught:
        check_fits(model, shape, mesh)
    message = str(caught.value)
    assert message.startswith(f"preset: '{name}' is not valid")
    assert f"needs {need:.1f} GiB" in message
    assert f"a {generation} chip has {shape.generation.hbm_gib} GiB HBM" in message
    assert "valid: " in message and "tiny" in message.split("valid: ")[1]


@pytest.mark.parametrize(
    ("mesh", "slices", "field", "valid"),
    [
        (MeshConfig(dcn_data=1, ici_fsdp=8), 2, "mesh.dcn_data", "2 (the number of slices)"),
        (MeshConfig(ici_fsdp=4), 1, "mesh.ici_data x ici_fsdp x ici_tensor", "8 (the chips"),
        (MeshConfig(ici_fsdp=0), 1, "mesh.ici_fsdp", "an integer >= 1"),
    ],
    ids=["dcn-not-slices", "ici-not-chips", "zero-axis"],
)
def test_mesh_must_tile_the_slices(mesh, slices, field, valid):
    with pytest.raises(PresetError) as caught:
        mesh.check(chips_per_slice=8, num_slices=slices)
    assert caught.value.field == field
    assert valid in str(caught.value)


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(PresetError, match=r"preset: '70b' is not valid; valid: tiny, 1b, 8b"):
        preset("70b")


def test_hybrid_mesh_shape_puts_slices_on_the_data_axis():
    mesh = MeshConfig.fsdp_over(chips_per_slice=16, num_slices=2)
    assert mesh.check(16, 2).shape == (2, 16, 1)
    assert mesh.devices == 32
    assert set(PRESETS) == {"tiny", "1b", "8b"}


def test_maxtext_published_v6e_mfu_reproduces_from_our_flop_count():
    """MaxText: Llama 3.1 8B on v6e-256, SL 8192, 7,207 tokens/s/device = 45.46 % MFU, counted
    with the whole attention square (12 x layers x seq x d_model), on the catalog's peak."""
    model = preset("8b")
    full_square = model.train_flops_per_token(8192) + 6 * model.n_layers * 8192 * model.d_model
    peak = catalog.generation("v6e").peak_bf16_tflops * 1e12
    assert 7207 * full_square / peak == pytest.approx(0.4546, rel=0.01)


def test_bench_presets_rows_place_each_preset_on_a_slice_that_fits():
    from bench import presets as bench_presets

    rows = {(r["preset"], r["generation"]): r for r in bench_presets.run(["1b", "8b"])["rows"]}
    assert rows[("8b", "v5e")]["slice"].startswith("v5e 4x8")
    assert rows[("8b", "v6e")]["slice"].startswith("v6e 2x4")
    for row in rows.values():
        assert row["memoryGiB"] <= catalog.generation(row["generation"]).hbm_gib
        assert 0.7 < row["mfuEstimate"] < 0.8


@pytest.fixture
def nothing_reserved(monkeypatch):
    """Fails the test if run_training gets as far as reserving a slice."""
    import workloads.slices.reservation

    def refuse(*args, **kwargs):
        pytest.fail("run_training reserved a slice for a config it should have refused")

    monkeypatch.setattr(workloads.slices.reservation, "reserve_slices", refuse)


@pytest.mark.parametrize(
    ("scale", "slices", "fragment"),
    [
        (("8b", MeshConfig(ici_fsdp=8)), 1, "preset: '8b' is not valid (needs 29.1 GiB"),
        (("tiny", MeshConfig(ici_fsdp=8)), 2, "mesh.dcn_data: 1 is not valid; valid: 2"),
        (
            ("tiny", MeshConfig(ici_tensor=8)),
            1,
            "valid: a divisor of the preset's n_kv_heads (2)",
        ),
    ],
    ids=["8b-over-hbm", "dcn-not-slices", "tensor-over-kv-heads"],
)
def test_run_training_refuses_before_reserving(nothing_reserved, scale, slices, fragment):
    from raytpu.presets import ScaleConfig
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training

    v5e = catalog.shape("v5e", "2x4", machine_type="ct5lp-hightpu-4t")
    with pytest.raises(PresetError) as caught:
        run_training(
            v5e,
            TrainConfig(checkpoint_dir="gs://bucket/run", global_batch=16),
            num_slices=slices,
            scale=ScaleConfig(*scale),
        )
    assert fragment in str(caught.value)


V5E_2X4 = ["--generation", "v5e", "--topology", "2x4", "--machine-type", "ct5lp-hightpu-8t"]
CLI_REFUSALS = {
    "unknown-preset": (["--preset", "70b"], "preset: '70b' is not valid; valid: tiny, 1b, 8b"),
    "over-hbm": (["--preset", "8b"], "a v5e chip has 16 GiB HBM"),
    "tensor-not-a-divisor": (
        ["--preset", "tiny", "--tensor", "3"],
        "--tensor: 3 is not valid; valid: a divisor of the slice's 8 chips",
    ),
    "tensor-without-preset": (
        ["--tensor", "2"],
        "--tensor: 2 is not valid; valid: unset without --preset or --init-from",
    ),
    "export-without-preset": (
        ["--export-to", "gs://b/hf"],
        "--export-to: 'gs://b/hf' is not valid; valid: unset without --preset or --init-from",
    ),
    "init-from-and-preset": (
        ["--preset", "tiny", "--init-from", "gs://b/hf"],
        "--preset: 'tiny' is not valid; valid: unset with --init-from",
    ),
}


@pytest.mark.parametrize(("extra", "fragment"), CLI_REFUSALS.values(), ids=CLI_REFUSALS)
def test_raytpu_train_preset_refused_before_starting_anything(extra, fragment, capsys):
    from raytpu_cli.main import main

    argv = ["train", *V5E_2X4, "--steps", "10", "--checkpoint-dir", "gs://b/run", *extra]
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err
