"""Stack configuration: the shipped stacks parse; every kind of bad value is a clear error
(key path, bad value, valid values) raised before anything is declared."""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.image import git_image_tag
from infra.config.schema import ConfigError, StackConfig
from infra.config.stack import load_stack, parse_config
from infra.offline import run_entrypoint
from raytpu.ray_versions import MINIMUM_RAY_VERSION, PINNED_RAY_VERSION

REPO = Path(__file__).resolve().parents[1]


def _dev_raw() -> dict[str, Any]:
    with (REPO / "Pulumi.dev.yaml").open() as handle:
        return yaml.safe_load(handle)["config"]


@pytest.fixture
def dev_raw() -> dict[str, Any]:
    """A fresh, mutable copy of the dev stack's ``config:`` mapping."""
    return copy.deepcopy(_dev_raw())


Mutation = Callable[[dict[str, Any]], None]


def _set(path: tuple[Any, ...], value: Any) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        target: Any = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _drop(path: tuple[Any, ...]) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        target: Any = raw
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _both(first: Mutation, second: Mutation) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        first(raw)
        second(raw)

    return mutate


def _append(key: str, item: dict[str, Any]) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        raw.setdefault(key, []).append(item)

    return mutate


S = "ray-tpu:slices"
C = "ray-tpu:cluster"
RC = "ray-tpu:rayClusters"
RS = "ray-tpu:rayServices"

# (id, mutation, key path, the bad value as the message shows it, a piece of the valid values)
BAD_VALUES = [
    (
        "unknown-top-key",
        _set(("ray-tpu:slice",), []),
        "ray-tpu:slice",
        "'ray-tpu:slice'",
        "ray-tpu:slices",
    ),
    (
        "unknown-nested-key",
        _set((S, 0, "topolgy"), "2x4"),
        f"{S}[0].topolgy",
        "'topolgy'",
        "topology",
    ),
    (
        "unknown-cluster-key",
        _set((C, "cpuPool", "nodes"), 3),
        f"{C}.cpuPool.nodes",
        "'nodes'",
        "minNodes",
    ),
    ("missing-project", _drop(("gcp:project",)), "gcp:project", "is required", "GCP project id"),
    ("bad-region", _set(("gcp:region",), "mars"), "gcp:region", "'mars'", "us-east5"),
    (
        "bad-generation",
        _set((S, 0, "generation"), "v9"),
        f"{S}[0].generation",
        "'v9'",
        "v4, v5e, v5p, v6e, tpu7x",
    ),
    ("bad-topology", _set((S, 1, "topology"), "4x5"), f"{S}[1].topology", "'4x5'", "2x2, 2x4, 4x4"),
    ("topology-dims", _set((S, 1, "topology"), "2x2x1"), f"{S}[1].topology", "'2x2x1'", "AxB"),
    (
        "ambiguous-2x4",
        _drop((S, 0, "machineType")),
        f"{S}[0].machineType",
        "is required",
        "ct6e-standard-4t (4 chips/host)",
    ),
    (
        "machine-of-other-generation",
        _set((S, 0, "machineType"), "ct5lp-hightpu-4t"),
        f"{S}[0].machineType",
        "'ct5lp-hightpu-4t'",
        "ct6e-standard-4t",
    ),
    (
        "zone-not-in-region",
        _set((S, 0, "zone"), "us-west4-a"),
        f"{S}[0].zone",
        "'us-west4-a'",
        "a zone of gcp:region us-east5",
    ),
    ("zone-malformed", _set((S, 0, "zone"), "east"), f"{S}[0].zone", "'east'", "us-east5-a"),
    (
        "bad-provisioning",
        _set((S, 0, "provisioning"), "cheap"),
        f"{S}[0].provisioning",
        "'cheap'",
        "on-demand, spot, reservation, flex-start",
    ),
    (
        "reservation-missing",
        _set((S, 1, "provisioning"), "reservation"),
        f"{S}[1].reservation",
        "is required",
        "projects/PROJECT/reservations/NAME",
    ),
    (
        "reservation-without-provisioning",
        _set((S, 1, "reservation"), "my-res"),
        f"{S}[1].provisioning",
        "'spot'",
        "reservation",
    ),
    (
        "reservation-name",
        _set((S, 1, "reservation"), "Bad Name!"),
        f"{S}[1].reservation",
        "'Bad Name!'",
        "projects/PROJECT/reservations/NAME",
    ),
    (
        "flex-start-fixed-size",
        _both(_set((S, 1, "provisioning"), "flex-start"), _set((S, 1, "scaleToZero"), False)),
        f"{S}[1].scaleToZero",
        "False",
        "true",
    ),
    ("count-zero", _set((S, 0, "count"), 0), f"{S}[0].count", "0", "an integer 1..64"),
    ("count-bool", _set((S, 0, "count"), True), f"{S}[0].count", "True", "an integer 1..64"),
    ("count-string", _set((S, 0, "count"), "2"), f"{S}[0].count", "'2'", "an integer 1..64"),
    (
        "duplicate-slice",
        _set((S, 1, "name"), "train"),
        f"{S}[1].name",
        "'train'",
        "a name not used elsewhere",
    ),
    (
        "slice-name",
        _set((S, 1, "name"), "Serve_Pool"),
        f"{S}[1].name",
        "'Serve_Pool'",
        "lowercase letters",
    ),
    ("slice-reference", _set((RS, 0, "slice"), "nope"), f"{RS}[0].slice", "'nope'", "train, serve"),
    (
        "replicas-over-count",
        _set((RC, 0, "replicas"), 2),
        f"{RC}[0].replicas",
        "2",
        "an integer 0..1",
    ),
    (
        "max-replicas-under-replicas",
        _both(_set((RC, 0, "replicas"), 1), _set((RC, 0, "maxReplicas"), 0)),
        f"{RC}[0].maxReplicas",
        "0",
        "an integer 1..1",
    ),
    (
        "slice-oversubscribed",
        _append(RC, {"name": "train2", "slice": "train", "replicas": 1}),
        f"{S}[0].count",
        "1",
        "an integer >= 2",
    ),
    (
        "duplicate-ray-name",
        _set((RS, 0, "name"), "train"),
        f"{RS}[0].name",
        "'train'",
        "unique across ray-tpu:rayClusters and ray-tpu:rayServices",
    ),
    (
        "import-path",
        _set((RS, 0, "importPath"), "workloads.serving.app"),
        f"{RS}[0].importPath",
        "'workloads.serving.app'",
        "module:attribute",
    ),
    (
        "worker-quantity",
        _set((RC, 0, "worker"), {"cpu": "lots"}),
        f"{RC}[0].worker.cpu",
        "'lots'",
        "Kubernetes quantity",
    ),
    (
        "ray-version-latest",
        _set(("ray-tpu:rayVersion",), "latest"),
        "ray-tpu:rayVersion",
        "'latest'",
        f"from {MINIMUM_RAY_VERSION} to {PINNED_RAY_VERSION}",
    ),
    (
        "ray-version-old",
        _set(("ray-tpu:rayVersion",), "2.54.0"),
        "ray-tpu:rayVersion",
        "'2.54.0'",
        f"from {MINIMUM_RAY_VERSION} to {PINNED_RAY_VERSION}",
    ),
    (
        "ray-version-untested",
        _set(("ray-tpu:rayVersion",), "2.61.0"),
        "ray-tpu:rayVersion",
        "'2.61.0'",
        "the releases the upgrade matrix passed",
    ),
    (
        "ray-version-float",
        _set(("ray-tpu:rayVersion",), 2.6),
        "ray-tpu:rayVersion",
        "2.6",
        "quoted",
    ),
    (
        "ray-version-full-width-digits",
        _set(("ray-tpu:rayVersion",), "\uff12.\uff16\uff10.\uff10"),
        "ray-tpu:rayVersion",
        "'\uff12.\uff16\uff10.\uff10'",
        "X.Y.Z",
    ),
    (
        "ray-version-trailing-newline",
        _set(("ray-tpu:rayVersion",), "2.60.0\n"),
        "ray-tpu:rayVersion",
        "'2.60.0\\n'",
        "X.Y.Z",
    ),
    (
        "image-full-width-tag",
        _set(("ray-tpu:rayImage",), "rayproject/ray:\uff12.\uff16\uff10.\uff10-py311"),
        "ray-tpu:rayImage",
        "'rayproject/ray:\uff12.\uff16\uff10.\uff10-py311'",
        "names no explicit Ray version",
    ),
    (
        "ray-version-missing",
        _drop(("ray-tpu:rayVersion",)),
        "ray-tpu:rayVersion",
        "is required",
        "X.Y.Z",
    ),
    (
        "image-latest",
        _set(("ray-tpu:rayImage",), "rayproject/ray:latest"),
        "ray-tpu:rayImage",
        "'rayproject/ray:latest'",
        "names no explicit Ray version",
    ),
    (
        "image-untagged",
        _set(("ray-tpu:rayImage",), "ghcr.io/me/ray"),
        "ray-tpu:rayImage",
        "'ghcr.io/me/ray'",
        "has no tag",
    ),
    (
        "image-template",
        _set(("ray-tpu:rayImage",), "${RAY_IMAGE}"),
        "ray-tpu:rayImage",
        "'${RAY_IMAGE}'",
        "is an unrendered template",
    ),
    (
        "image-other-ray",
        _set(("ray-tpu:rayImage",), "rayproject/ray:2.59.0-py311"),
        "ray-tpu:rayImage",
        "'rayproject/ray:2.59.0-py311'",
        "runs Ray 2.59.0",
    ),
    (
        "object-image-latest",
        _set((RC, 0, "image"), "me/ray:latest"),
        f"{RC}[0].image",
        "'me/ray:latest'",
        "an image whose tag names Ray 2.60.0",
    ),
    (
        "image-digest-only",
        _set(("ray-tpu:rayImage",), "ghcr.io/me/ray@sha256:" + "0" * 64),
        "ray-tpu:rayImage",
        repr("ghcr.io/me/ray@sha256:" + "0" * 64),
        "pinned by digest only",
    ),
    (
        "image-custom-other-ray",
        _set((RC, 0, "image"), "us-docker.pkg.dev/p/r/ray:2.58.0-py311-abc123"),
        f"{RC}[0].image",
        "'us-docker.pkg.dev/p/r/ray:2.58.0-py311-abc123'",
        "runs Ray 2.58.0",
    ),
    (
        "release-channel",
        _set((C, "releaseChannel"), "FAST"),
        f"{C}.releaseChannel",
        "'FAST'",
        "RAPID, REGULAR, STABLE, EXTENDED",
    ),
    (
        "gke-too-old",
        _set((C, "minMasterVersion"), "1.29"),
        f"{C}.minMasterVersion",
        "'1.29'",
        "1.30.0-gke.1747000",
    ),
    (
        "gke-patch-too-old",
        _set((C, "minMasterVersion"), "1.30.0-gke.1000"),
        f"{C}.minMasterVersion",
        "'1.30.0-gke.1000'",
        "1.30.0-gke.1747000",
    ),
    (
        "cluster-location",
        _set((C, "location"), "europe-west4"),
        f"{C}.location",
        "'europe-west4'",
        "the region us-east5",
    ),
    (
        "private-nodes-bool",
        _set((C, "privateNodes"), "yes"),
        f"{C}.privateNodes",
        "'yes'",
        "true or false",
    ),
    (
        "flex-start-needs-gke-1.33",
        _both(_set((S, 1, "provisioning"), "flex-start"), _set((C, "minMasterVersion"), "1.32")),
        f"{C}.minMasterVersion",
        "'1.32'",
        "1.33.0-gke.1712000",
    ),
    ("cloud-nat-bool", _set((C, "cloudNat"), "no"), f"{C}.cloudNat", "'no'", "true or false"),
    (
        "master-cidr",
        _set((C, "masterIpv4CidrBlock"), "10.0.0.0/24"),
        f"{C}.masterIpv4CidrBlock",
        "'10.0.0.0/24'",
        "/28",
    ),
    (
        "authorized-network",
        _set((C, "masterAuthorizedNetworks"), [{"cidrBlock": "10.0.0.0"}]),
        f"{C}.masterAuthorizedNetworks[0].cidrBlock",
        "'10.0.0.0'",
        "CIDR",
    ),
    (
        "cpu-pool-tpu-machine",
        _set((C, "cpuPool", "machineType"), "ct6e-standard-4t"),
        f"{C}.cpuPool.machineType",
        "'ct6e-standard-4t'",
        "without accelerators",
    ),
    (
        "cpu-pool-max-below-min",
        _set((C, "cpuPool", "maxNodes"), 0),
        f"{C}.cpuPool.maxNodes",
        "0",
        "1..100",
    ),
    (
        "cpu-pool-zone",
        _set((C, "cpuPool", "zones"), ["us-central1-a"]),
        f"{C}.cpuPool.zones[0]",
        "'us-central1-a'",
        "us-east5",
    ),
    ("slices-not-list", _set((S,), {"train": {}}), S, "{'train': {}}", "a list of mappings"),
    (
        "service-runtime-env-not-plain",
        _set((RS, 0, "runtimeEnv"), {"env_vars": {"FROM": datetime.date(2026, 1, 1)}}),
        f"{RS}[0].runtimeEnv",
        repr({"env_vars": {"FROM": datetime.date(2026, 1, 1)}}),
        "plain strings, numbers, lists, mappings",
    ),
    (
        "job-runtime-env-not-plain",
        _set(
            ("ray-tpu:rayJobs",),
            [{"name": "run", "slice": "serve", "runtimeEnv": {"FROM": datetime.date(2026, 1, 1)}}],
        ),
        "ray-tpu:rayJobs[0].runtimeEnv",
        repr({"FROM": datetime.date(2026, 1, 1)}),
        "plain strings, numbers, lists, mappings",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "path", "shown", "valid"),
    [case[1:] for case in BAD_VALUES],
    ids=[case[0] for case in BAD_VALUES],
)
def test_bad_value_is_a_clear_error(
    dev_raw: dict[str, Any], mutate: Mutation, path: str, shown: str, valid: str
) -> None:
    mutate(dev_raw)
    with pytest.raises(ConfigError) as caught:
        parse_config(dev_raw)
    matching = [e for e in caught.value.errors if e.startswith(f"{path}: ")]
    assert matching, f"no error for {path}; got: {caught.value.errors}"
    message = matching[0]
    if shown == "is required":
        assert f"{path}: is required" in message
    else:
        assert f"{path}: {shown} is not valid" in message
    assert "; valid: " in message
    assert valid in message.split("; valid: ", 1)[1], message


def test_every_problem_is_reported_at_once(dev_raw: dict[str, Any]) -> None:
    dev_raw[S][0]["topology"] = "9x9"
    dev_raw[S][1]["zone"] = "us-west1-b"
    dev_raw["ray-tpu:rayVersion"] = "latest"
    with pytest.raises(ConfigError) as caught:
        parse_config(dev_raw)
    paths = [e.split(": ", 1)[0] for e in caught.value.errors]
    assert paths == ["ray-tpu:rayVersion", f"{S}[0].topology", f"{S}[1].zone"]
    assert str(caught.value).startswith("3 problems in the stack configuration:")


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (_set((S, 1, "topology"), "4x5"), f"{S}[1].topology"),
        (_set(("ray-tpu:rayVersion",), "latest"), "ray-tpu:rayVersion"),
        (_set((RS, 0, "slice"), "nope"), f"{RS}[0].slice"),
    ],
    ids=["topology", "ray-version", "slice-reference"],
)
def test_bad_config_declares_nothing(dev_raw: dict[str, Any], mutate: Mutation, path: str) -> None:
    """The real ``__main__.py`` under mocks: the error comes before any resource."""
    mutate(dev_raw)
    run = run_entrypoint(dev_raw, stack="dev")
    assert isinstance(run.error, ConfigError)
    assert any(e.startswith(f"{path}: ") for e in run.error.errors)
    assert run.resources == []


def test_good_config_through_the_entrypoint_declares_the_stack(dev_raw: dict[str, Any]) -> None:
    """The same path with the dev config declares resources (so the test above can fail)."""
    run = run_entrypoint(dev_raw, stack="dev")
    assert run.error is None
    types = {r.type for r in run.resources}
    assert "gcp:container/cluster:Cluster" in types
    assert "kubernetes:ray.io/v1:RayCluster" in types


@pytest.mark.parametrize(
    "image",
    [
        "rayproject/ray:2.60.0-py311",
        "us-docker.pkg.dev/p/r/ray:2.60.0-py311-abc123",
        "us-docker.pkg.dev/p/r/ray:2.60.0-py311@sha256:" + "0" * 64,
    ],
    ids=["ray-image", "custom-tag", "custom-tag-and-digest"],
)
def test_images_whose_tag_names_the_ray_version_are_accepted(
    dev_raw: dict[str, Any], image: str
) -> None:
    dev_raw["ray-tpu:rayImage"] = image
    assert parse_config(dev_raw).ray_image == image


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_shipped_stacks_parse(stack: str) -> None:
    config = load_stack(stack)
    assert isinstance(config, StackConfig)
    assert config.ray_version == "2.60.0"
    # The worker image built from Dockerfile, in the stack's own registry, at this commit.
    assert config.ray_image == (
        f"us-east5-docker.pkg.dev/ray-tpu-{stack}/ray-tpu/ray:2.60.0-py311-{git_image_tag()}"
    )
    for obj in (*config.ray_clusters, *config.ray_services):
        assert config.slice(obj.slice).name == obj.slice


def test_dev_stack_shapes() -> None:
    config = load_stack("dev")
    train, serve = config.slice("train"), config.slice("serve")
    assert (train.shape.hosts, train.shape.chips_per_host, train.provisioning) == (2, 4, "spot")
    assert (serve.shape.hosts, serve.shape.chips, serve.provisioning) == (1, 4, "spot")
    assert config.ray_services[0].import_path == "workloads.serve:app"
    assert config.cluster.deletion_protection is False


def test_prod_stack_shapes() -> None:
    config = load_stack("prod")
    summary = {
        s.name: (s.shape.generation.name, s.shape.topology, s.shape.hosts, s.count, s.provisioning)
        for s in config.slices
    }
    assert summary["train"] == ("v6e", "4x4", 4, 2, "on-demand")
    assert summary["research"] == ("v5p", "2x2x4", 4, 1, "reservation")
    assert config.slice("research").reservation
    assert "serve" in summary
    assert config.cluster.deletion_protection is True


def test_unknown_slice_lookup_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"'nope' is not valid; valid: train, serve"):
        load_stack("dev").slice("nope")


def test_unknown_stack_lists_the_stacks(tmp_path: Path) -> None:
    for name in ("dev", "prod"):
        (tmp_path / f"Pulumi.{name}.yaml").write_text((REPO / f"Pulumi.{name}.yaml").read_text())
    with pytest.raises(ConfigError, match=r"stack: 'staging' is not valid; valid: dev, prod"):
        load_stack("staging", tmp_path)
    assert load_stack("prod", tmp_path).cluster.name == "ray-tpu-prod"


def test_entrypoint_reads_older_engine_key_spelling(dev_raw: dict[str, Any]) -> None:
    """Older Pulumi engines hand config over as ``ray-tpu:config:slices``: same stack."""
    legacy = {
        (f"{k.split(':', 1)[0]}:config:{k.split(':', 1)[1]}" if k.startswith("ray-tpu:") else k): v
        for k, v in dev_raw.items()
    }
    current, old = run_entrypoint(dev_raw), run_entrypoint(legacy)
    assert current.error is None and old.error is None
    assert sorted(r.urn for r in old.resources) == sorted(r.urn for r in current.resources)
    assert old.outputs["slices"] == current.outputs["slices"]


def _slice(generation: str, topology: str, **extra: Any) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        entry = raw[S][1]
        entry.pop("machineType", None)
        entry.update(generation=generation, topology=topology, **extra)

    return mutate


# (id, mutation, error path or None when accepted, the reason the error must give)
GATES = [
    (
        "tpu7x-on-gke-1.33",
        _slice("tpu7x", "2x2x2"),
        f"{C}.minMasterVersion: '1.33' is not valid; valid: a GKE version >= 1.34.0-gke.2201000",
        "tpu7x slices need it: serve",
    ),
    (
        "tpu7x-on-gke-1.34.0-gke.2200000",
        _both(_slice("tpu7x", "2x2x1"), _set((C, "minMasterVersion"), "1.34.0-gke.2200000")),
        f"{C}.minMasterVersion: '1.34.0-gke.2200000' is not valid",
        "tpu7x slices need it: serve",
    ),
    (
        "tpu7x-on-gke-1.34.0-gke.2201000",
        _both(
            _both(_slice("tpu7x", "2x2x2"), _set((C, "minMasterVersion"), "1.34.0-gke.2201000")),
            _set(("ray-tpu:pythonVersion",), "3.12"),
        ),
        None,
        "",
    ),
    (
        "tpu7x-on-gke-1.35",
        _both(
            _both(_slice("tpu7x", "2x2x2"), _set((C, "minMasterVersion"), "1.35")),
            _set(("ray-tpu:pythonVersion",), "3.12"),
        ),
        None,
        "",
    ),
    (
        "v4-flex-start",
        _slice("v4", "2x2x2", provisioning="flex-start"),
        f"{S}[1].provisioning: 'flex-start' is not valid; valid: on-demand, spot, reservation",
        "GKE does not offer flex-start for v4 TPUs",
    ),
    (
        "v5p-flex-start",
        _both(
            _slice("v5p", "2x2x2", provisioning="flex-start"),
            _set((RS, 0), {"name": "serve", "slice": "serve", "replicas": 0, "minReplicas": 0,
                           "maxReplicas": 1, "importPath": "workloads.serve:app"}),
        ),
        None,
        "",
    ),
    ("v4-spot", _slice("v4", "2x2x2"), None, ""),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mutate", "error", "reason"), [g[1:] for g in GATES], ids=[g[0] for g in GATES]
)
def test_config_gates_refuse_with_their_reason(
    dev_raw: dict[str, Any], mutate: Mutation, error: str | None, reason: str
) -> None:
    mutate(dev_raw)
    if error is None:
        assert isinstance(parse_config(dev_raw), StackConfig)
        return
    with pytest.raises(ConfigError) as caught:
        parse_config(dev_raw)
    matching = [e for e in caught.value.errors if e.startswith(error)]
    assert matching, caught.value.errors
    assert f"({reason})" in matching[0], matching[0]
