"""The TPU catalog: every generation, valid and invalid shapes, the v5e/v6e 2x4 ambiguity."""

from __future__ import annotations

import json

import pytest

from raytpu import catalog, generations
from raytpu_cli.main import main

# (generation, topology, machine type or None, hosts, chips, chips/host, pod type, multi-host)
VALID = [
    ("v4", "2x2x1", None, 1, 4, 4, "v4-8", False),
    ("v4", "2x2x4", None, 4, 16, 4, "v4-32", True),
    ("v4", "4x4x8", "ct4p-hightpu-4t", 32, 128, 4, "v4-256", True),
    ("v5e", "1x1", None, 1, 1, 1, "v5litepod-1", False),
    ("v5e", "2x4", "ct5lp-hightpu-8t", 1, 8, 8, "v5litepod-8", False),
    ("v5e", "2x4", "ct5lp-hightpu-4t", 2, 8, 4, "v5litepod-8", True),
    ("v5e", "16x16", None, 64, 256, 4, "v5litepod-256", True),
    ("v5p", "2x2x1", None, 1, 4, 4, "v5p-8", False),
    ("v5p", "2x2x4", None, 4, 16, 4, "v5p-32", True),
    ("v5p", "8x8x16", None, 256, 1024, 4, "v5p-2048", True),
    ("v6e", "1x1", "ct6e-standard-1t", 1, 1, 1, "v6e-1", False),
    ("v6e", "2x2", None, 1, 4, 4, "v6e-4", False),
    ("v6e", "2x4", "ct6e-standard-8t", 1, 8, 8, "v6e-8", False),
    ("v6e", "2x4", "ct6e-standard-4t", 2, 8, 4, "v6e-8", True),
    ("v6e", "4x4", None, 4, 16, 4, "v6e-16", True),
    ("v6e", "16x16", None, 64, 256, 4, "v6e-256", True),
    ("tpu7x", "2x2x1", None, 1, 4, 4, "v7x-8", False),
    ("tpu7x", "4x4x4", "tpu7x-standard-4t", 16, 64, 4, "v7x-128", True),
]


@pytest.mark.parametrize(
    ("gen", "topology", "machine", "hosts", "chips", "per_host", "pod_type", "multi"),
    VALID,
    ids=[f"{v[0]}-{v[1]}-{v[2] or 'default'}" for v in VALID],
)
def test_valid_shapes(gen, topology, machine, hosts, chips, per_host, pod_type, multi):
    s = catalog.shape(gen, topology, machine_type=machine)
    assert (s.hosts, s.chips, s.chips_per_host) == (hosts, chips, per_host)
    assert s.pod_type == pod_type
    assert s.multi_host is multi
    assert s.hosts * s.chips_per_host == s.chips
    assert s.ray_head_resource == f"TPU-{pod_type}-head"


# (generation, topology, machine type, field named in the error, text the error must contain)
INVALID = [
    ("v9", "2x2", None, "generation", "v4, v5e, v5p, v6e, tpu7x"),
    ("v6e", "4x5", None, "topology", "16x16"),
    ("v6e", "2x2x2", None, "topology", "2D"),
    ("v4", "4x4", None, "topology", "3D"),
    ("v4", "2x2x3", None, "topology", "multiples of 4"),
    ("v4", "8x4x4", None, "topology", "A<=B<=C"),
    ("v5p", "4x4x", None, "topology", "AxBxC"),
    ("v6e", "2x4", None, "machineType", "ct6e-standard-4t (4 chips/host)"),
    ("v5e", "2x4", None, "machineType", "ct5lp-hightpu-8t (8 chips/host)"),
    ("v6e", "4x4", "ct6e-standard-8t", "machineType", "ct6e-standard-4t"),
    ("v6e", "2x2", "ct6e-standard-1t", "machineType", "ct6e-standard-4t"),
    ("v6e", "4x4", "ct5lp-hightpu-4t", "machineType", "ct6e-standard-1t, ct6e-standard-4t"),
    ("tpu7x", "4x4x12", None, "topology", "8x16x16"),
]


@pytest.mark.parametrize(
    ("gen", "topology", "machine", "field", "valid_text"),
    INVALID,
    ids=[f"{v[0]}-{v[1]}-{v[2] or 'default'}" for v in INVALID],
)
def test_invalid_shapes_name_field_value_and_valid_ones(gen, topology, machine, field, valid_text):
    with pytest.raises(generations.CatalogError) as caught:
        catalog.shape(gen, topology, machine_type=machine)
    error = caught.value
    assert error.field == field
    assert field in str(error)
    assert valid_text in str(error)


def test_every_common_shape_is_consistent_and_accepted():
    shapes = catalog.common_shapes()
    assert {s.generation.name for s in shapes} == set(generations.GENERATIONS)
    for s in shapes:
        assert s.hosts * s.chips_per_host == s.chips, s.name
        again = catalog.shape(s.generation.name, s.topology, machine_type=s.machine_type)
        assert again == s


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v6e", "v6e"),
        ("TPU-V6E", "v6e"),
        ("tpu-v6e-slice", "v6e"),
        ("v5litepod", "v5e"),
        ("TPU-V5LITEPOD", "v5e"),
        ("v7x", "tpu7x"),
        ("tpu7x", "tpu7x"),
    ],
    ids=lambda v: v,
)
def test_generation_aliases(name, expected):
    assert catalog.generation(name).name == expected


@pytest.mark.parametrize(
    ("machine", "topology", "hosts"),
    [
        ("ct6e-standard-4t", "2x4", 2),
        ("ct6e-standard-8t", "2x4", 1),
        ("ct6e-standard-4t", None, 1),
        ("ct5p-hightpu-4t", "2x2x4", 4),
        ("tpu7x-standard-4t", "2x2x2", 2),
    ],
    ids=["v6e-2x4-4t", "v6e-2x4-8t", "v6e-4t-no-topology", "v5p-2x2x4", "tpu7x-2x2x2"],
)
def test_shape_from_machine_type(machine, topology, hosts):
    assert catalog.shape_from_machine_type(machine, topology).hosts == hosts


def test_shape_from_gke_labels_decides_by_chips_per_host():
    assert catalog.shape_from_gke_labels("tpu-v6e-slice", "2x4", 4).hosts == 2
    assert catalog.shape_from_gke_labels("tpu-v6e-slice", "2x4", 8).hosts == 1
    with pytest.raises(generations.CatalogError, match="tpu-v6e-slice"):
        catalog.shape_from_gke_labels("tpu-v9-slice", "2x4", 4)


def test_node_selector_uses_both_gke_labels():
    s = catalog.shape("v6e", "4x4")
    assert s.node_selector == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "4x4",
    }


def test_cli_json_has_exactly_the_documented_keys(capsys):
    assert main(["catalog", "v6e", "2x4", "--machine-type", "ct6e-standard-4t", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record == {
        "generation": "v6e",
        "topology": "2x4",
        "machineType": "ct6e-standard-4t",
        "chipsPerHost": 4,
        "hosts": 2,
        "chips": 8,
        "gkeAccelerator": "tpu-v6e-slice",
        "rayAcceleratorType": "TPU-V6E",
        "acceleratorVersion": "v6e",
        "podType": "v6e-8",
        "multiHost": True,
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["catalog", "v6e", "4x5", "--json"], "topology: '4x5' is not valid"),
        (["catalog", "v6e", "2x4", "--json"], "machineType: is required"),
        (["catalog", "v9", "2x2"], "generation: 'v9' is not valid"),
        (["catalog", "v6e"], "give both GENERATION and TOPOLOGY"),
    ],
    ids=["bad-topology", "ambiguous-2x4", "bad-generation", "missing-topology"],
)
def test_cli_invalid_shape_exits_2_with_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_cli_table_lists_every_generation(capsys):
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    for gen in generations.GENERATIONS:
        assert f"\n{gen} " in out
