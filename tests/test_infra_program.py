"""The Pulumi program under mocks, for both shipped stacks and for shapes they do not use:
the GKE cluster and its Ray Operator add-on, every node pool's inputs as the engine sees them
(camelCase, numbers as floats), every KubeRay spec, the stack outputs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.stack import load_stack, parse_config
from infra.offline import DeclaredResource, ProgramRun, run_program_detailed, run_stack

REPO = Path(__file__).resolve().parents[1]
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
PROVIDER = "pulumi:providers:kubernetes"
RAY_CLUSTER = "kubernetes:ray.io/v1:RayCluster"
RAY_SERVICE = "kubernetes:ray.io/v1:RayService"
NAMESPACE = "kubernetes:core/v1:Namespace"


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    """Each shipped stack declared once under mocks (about a second each)."""
    return {
        stack: run_program_detailed(load_stack(stack), stack=stack) for stack in ("dev", "prod")
    }


def _one(run: ProgramRun, type_: str, **props: Any) -> DeclaredResource:
    found = [r for r in run.of_type(type_) if all(r.props.get(k) == v for k, v in props.items())]
    assert len(found) == 1, f"{type_} {props}: found {len(found)}"
    return found[0]


def _by_name(run: ProgramRun, type_: str) -> dict[str, DeclaredResource]:
    return {
        r.props.get("name", r.props.get("metadata", {}).get("name")): r for r in run.of_type(type_)
    }


# ---------------------------------------------------------------------------- the GKE cluster

CLUSTERS = {
    # stack: (name, release channel, deletion protection, private nodes, authorized networks)
    "dev": ("ray-tpu-dev", "REGULAR", False, False, None),
    "prod": (
        "ray-tpu-prod",
        "STABLE",
        True,
        True,
        [{"cidrBlock": "10.0.0.0/8", "displayName": "corp"}],
    ),
}


@pytest.mark.parametrize("stack", sorted(CLUSTERS), ids=sorted(CLUSTERS))
def test_gke_cluster(runs: dict[str, ProgramRun], stack: str) -> None:
    name, channel, protection, private, networks = CLUSTERS[stack]
    props = _one(runs[stack], CLUSTER).props
    assert props["name"] == name
    assert props["removeDefaultNodePool"] is True
    assert props["initialNodeCount"] == 1.0
    assert props["releaseChannel"] == {"channel": channel}
    assert props["deletionProtection"] is protection
    assert props["workloadIdentityConfig"] == {"workloadPool": f"ray-tpu-{stack}.svc.id.goog"}
    assert props["minMasterVersion"] == "1.33"
    assert "enableTpu" not in props  # the legacy TPU integration
    if private:
        assert props["privateClusterConfig"]["enablePrivateNodes"] is True
        assert props["privateClusterConfig"]["masterIpv4CidrBlock"] == "172.16.0.32/28"
        assert props["masterAuthorizedNetworksConfig"] == {"cidrBlocks": networks}
    else:
        assert "privateClusterConfig" not in props
        assert "masterAuthorizedNetworksConfig" not in props


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_ray_operator_addon_is_a_list_with_logging_and_monitoring(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    addons = _one(runs[stack], CLUSTER).props["addonsConfig"]
    assert addons["rayOperatorConfigs"] == [
        {
            "enabled": True,
            "rayClusterLoggingConfig": {"enabled": True},
            "rayClusterMonitoringConfig": {"enabled": True},
        }
    ]


@pytest.mark.parametrize(("stack", "nat"), [("dev", False), ("prod", True)], ids=["dev", "prod"])
def test_cloud_nat_with_private_nodes(runs: dict[str, ProgramRun], stack: str, nat: bool) -> None:
    gateways = runs[stack].of_type("gcp:compute/routerNat:RouterNat")
    routers = runs[stack].of_type("gcp:compute/router:Router")
    assert (len(gateways), len(routers)) == ((1, 1) if nat else (0, 0))
    if nat:
        (gateway,), (router,) = gateways, routers
        assert gateway.props["router"] == router.props["name"]
        assert gateway.props["sourceSubnetworkIpRangesToNat"] == "ALL_SUBNETWORKS_ALL_IP_RANGES"
        assert router.props["region"] == gateway.props["region"] == "us-east5"
        for kind in (RAY_CLUSTER, RAY_SERVICE):  # pods on private nodes pull through NAT
            assert all(gateway.urn in r.dependencies for r in runs[stack].of_type(kind))


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_no_helm_install_of_kuberay(runs: dict[str, ProgramRun], stack: str) -> None:
    """GKE's Ray Operator add-on runs KubeRay; the only Helm release is Kueue's (with teams)."""
    helm = [r for r in runs[stack].resources if "helm" in r.type.lower()]
    assert all(r.props["chart"].endswith("/kueue") for r in helm), helm
    assert not [r for r in helm if "kuberay" in str(r.props).lower()]


# ---------------------------------------------------------------------------- node pools

FIXED, TO_ZERO = "fixed", "scale-to-zero"
"""The two node-count forms: ``nodeCount`` == hosts and no autoscaling; or autoscaling 0..hosts
with ``initialNodeCount`` (0 for flex-start) and no ``nodeCount`` (docs/infra.md)."""

# (stack, pool): machine type, hosts, tpuTopology (None: single host), zone, node-count form,
# provisioning, reservation
TPU_POOLS = {
    ("dev", "train-0"): ("ct6e-standard-4t", 2, "2x4", "us-east5-b", TO_ZERO, "spot", None),
    ("dev", "serve-0"): ("ct6e-standard-4t", 1, None, "us-east5-b", FIXED, "spot", None),
    ("prod", "train-0"): ("ct6e-standard-4t", 4, "4x4", "us-east5-b", FIXED, "on-demand", None),
    ("prod", "train-1"): ("ct6e-standard-4t", 4, "4x4", "us-east5-b", FIXED, "on-demand", None),
    ("prod", "research-0"): (
        "ct5p-hightpu-4t",
        4,
        "2x2x4",
        "us-east5-a",
        FIXED,
        "reservation",
        "ray-tpu-v5p-reservation",
    ),
    ("prod", "serve-0"): ("ct6e-standard-8t", 1, None, "us-east5-b", FIXED, "on-demand", None),
    ("prod", "serve-1"): ("ct6e-standard-8t", 1, None, "us-east5-b", FIXED, "on-demand", None),
}


def _check_tpu_pool(
    props: dict[str, Any],
    machine: str,
    hosts: int,
    topology: str | None,
    zone: str,
    form: str,
    provisioning: str,
    reservation: str | None,
) -> None:
    node = props["nodeConfig"]
    assert node["machineType"] == machine
    assert props["nodeLocations"] == [zone]
    counts = {k: props.get(k) for k in ("nodeCount", "initialNodeCount", "autoscaling")}
    if form == FIXED:
        assert counts == {"nodeCount": float(hosts), "initialNodeCount": None, "autoscaling": None}
        assert isinstance(props["nodeCount"], float)  # the engine's view: numbers are floats
    else:
        start = 0.0 if provisioning == "flex-start" else float(hosts)
        assert counts == {
            "nodeCount": None,  # never beside autoscaling (pulumi-gcp's docs)
            "initialNodeCount": start,
            "autoscaling": {"minNodeCount": 0.0, "maxNodeCount": float(hosts)},
        }
    if topology is None:
        assert "placementPolicy" not in props, "single-host pools must not set tpuTopology"
    else:
        assert props["placementPolicy"] == {"type": "COMPACT", "tpuTopology": topology}
    assert node.get("spot", False) is (provisioning == "spot")
    assert node.get("flexStart", False) is (provisioning == "flex-start")
    if provisioning == "reservation":
        assert node["reservationAffinity"] == {
            "consumeReservationType": "SPECIFIC_RESERVATION",
            "key": "compute.googleapis.com/reservation-name",
            "values": [reservation],
        }
    elif provisioning == "flex-start":
        assert node["reservationAffinity"] == {"consumeReservationType": "NO_RESERVATION"}
    else:
        assert "reservationAffinity" not in node
    assert node["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert "taints" not in node  # GKE taints TPU nodes itself (docs/infra.md)


@pytest.mark.parametrize(
    ("stack", "pool", "expected"),
    [(stack, pool, expected) for (stack, pool), expected in TPU_POOLS.items()],
    ids=[f"{stack}-{pool}" for stack, pool in TPU_POOLS],
)
def test_tpu_node_pool(runs: dict[str, ProgramRun], stack: str, pool: str, expected: tuple) -> None:
    resource = _one(runs[stack], NODE_POOL, name=pool)
    _check_tpu_pool(resource.props, *expected)
    # initialNodeCount is a creation-time value: a later edit must not replace the pool.
    assert resource.ignore_changes == (("initialNodeCount",) if expected[4] == TO_ZERO else ())
    assert resource.props["location"] == "us-east5"
    assert resource.props["cluster"] == f"ray-tpu-{stack}"
    assert resource.props["nodeConfig"]["labels"]["ray-tpu/slice"] == pool.rsplit("-", 1)[0]
    assert resource.parent is not None and "ray-tpu:infra:TpuSlice" in resource.urn


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_exactly_the_expected_node_pools(runs: dict[str, ProgramRun], stack: str) -> None:
    names = set(_by_name(runs[stack], NODE_POOL))
    assert names == {pool for s, pool in TPU_POOLS if s == stack} | {"cpu"}
    assert runs[stack].of_type(POLICY) == []  # no tpu7x in the shipped stacks


CPU_POOLS = {
    "dev": ("n2-standard-8", ["us-east5-b"], 1, 3),
    "prod": ("n2-standard-16", ["us-east5-a", "us-east5-b"], 1, 4),
}


@pytest.mark.parametrize("stack", sorted(CPU_POOLS), ids=sorted(CPU_POOLS))
def test_cpu_pool(runs: dict[str, ProgramRun], stack: str) -> None:
    machine, zones, low, high = CPU_POOLS[stack]
    props = _one(runs[stack], NODE_POOL, name="cpu").props
    assert props["nodeConfig"]["machineType"] == machine
    assert props["nodeLocations"] == zones
    assert props["autoscaling"] == {"minNodeCount": float(low), "maxNodeCount": float(high)}
    assert "placementPolicy" not in props


# ---------------------------------------------------------------------------- shapes the stacks
# do not use: tpu7x workload policy, flex-start, v4, many single-host slices


def _config_with(slices: list[dict[str, Any]]) -> Any:
    with (REPO / "Pulumi.dev.yaml").open() as handle:
        raw = copy.deepcopy(yaml.safe_load(handle)["config"])
    raw["ray-tpu:slices"] = slices
    raw["ray-tpu:cluster"]["minMasterVersion"] = "1.34"  # tpu7x needs 1.34.0-gke.2201000
    raw["ray-tpu:pythonVersion"] = "3.12"  # tpu7x needs jax[tpu] >= 0.8.2 on Python 3.12
    first = slices[0]
    to_zero = first.get("scaleToZero") or first.get("provisioning") == "flex-start"
    # A worker group on a scale-to-zero slice keeps no replica (the pool must reach zero).
    counts = {"replicas": 0, "minReplicas": 0, "maxReplicas": 1} if to_zero else {"replicas": 1}
    raw["ray-tpu:rayClusters"] = [{"name": "work", "slice": first["name"], **counts}]
    raw["ray-tpu:rayServices"] = []
    return parse_config(raw)


def _slice(name: str, generation: str, topology: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "generation": generation,
        "topology": topology,
        "zone": "us-east5-b",
        **extra,
    }


TPU7X_POOLS = [
    # (id, extra slice config, node-count form, provisioning)
    ("fixed", {}, FIXED, "on-demand"),
    ("scale-to-zero-spot", {"provisioning": "spot", "scaleToZero": True}, TO_ZERO, "spot"),
    ("flex-start", {"provisioning": "flex-start"}, TO_ZERO, "flex-start"),
]


@pytest.mark.parametrize(
    ("extra", "form", "provisioning"),
    [case[1:] for case in TPU7X_POOLS],
    ids=[case[0] for case in TPU7X_POOLS],
)
def test_tpu7x_multi_host_uses_a_high_throughput_workload_policy(
    extra: dict[str, Any], form: str, provisioning: str
) -> None:
    run = run_program_detailed(_config_with([_slice("ironwood", "tpu7x", "2x2x2", **extra)]))
    policy = _one(run, POLICY)
    assert policy.props["workloadPolicy"] == {
        "type": "HIGH_THROUGHPUT",
        "acceleratorTopology": "2x2x2",
    }
    assert policy.props["region"] == "us-east5"
    pool = _one(run, NODE_POOL, name="ironwood-0")
    # The form GKE stores (vllm-project/ci-infra#547): policyName and tpuTopology, no type
    # (pulumi-gcp requires the key: "" is sent as absent; COMPACT would diff against GKE).
    assert pool.props["placementPolicy"] == {
        "type": "",
        "policyName": policy.props["name"],
        "tpuTopology": "2x2x2",
    }
    props = {**pool.props, "placementPolicy": {"type": "COMPACT", "tpuTopology": "2x2x2"}}
    _check_tpu_pool(props, "tpu7x-standard-4t", 2, "2x2x2", "us-east5-b", form, provisioning, None)
    assert pool.ignore_changes == (("initialNodeCount",) if form == TO_ZERO else ())


SHAPES = [
    # (id, slice config, pool names, expected per pool as in TPU_POOLS)
    (
        "tpu7x-single-host",
        _slice("x", "tpu7x", "2x2x1"),
        ["x-0"],
        ("tpu7x-standard-4t", 1, None, "us-east5-b", FIXED, "on-demand", None),
    ),
    (
        "v6e-flex-start",
        _slice("flex", "v6e", "4x4", provisioning="flex-start"),
        ["flex-0"],
        ("ct6e-standard-4t", 4, "4x4", "us-east5-b", TO_ZERO, "flex-start", None),
    ),
    (
        "v6e-multi-host-spot-scale-to-zero",
        _slice("burst", "v6e", "4x8", provisioning="spot", scaleToZero=True),
        ["burst-0"],
        ("ct6e-standard-4t", 8, "4x8", "us-east5-b", TO_ZERO, "spot", None),
    ),
    (
        "v5e-single-host-scale-to-zero",
        _slice("one", "v5e", "2x2", scaleToZero=True),
        ["one-0"],
        ("ct5lp-hightpu-4t", 1, None, "us-east5-b", TO_ZERO, "on-demand", None),
    ),
    (
        "v4-multi-host-spot",
        _slice("v4", "v4", "2x2x4", provisioning="spot"),
        ["v4-0"],
        ("ct4p-hightpu-4t", 4, "2x2x4", "us-east5-b", FIXED, "spot", None),
    ),
    (
        "v5e-single-host-x3",
        _slice("tiny", "v5e", "1x1", count=3),
        ["tiny-0", "tiny-1", "tiny-2"],
        ("ct5lp-hightpu-1t", 1, None, "us-east5-b", FIXED, "on-demand", None),
    ),
    (
        "v5p-shared-reservation",
        _slice(
            "res",
            "v5p",
            "2x2x2",
            provisioning="reservation",
            reservation="projects/other-project/reservations/pool-a",
        ),
        ["res-0"],
        (
            "ct5p-hightpu-4t",
            2,
            "2x2x2",
            "us-east5-b",
            FIXED,
            "reservation",
            "projects/other-project/reservations/pool-a",
        ),
    ),
    (
        "v6e-2x4-one-host",
        _slice("big", "v6e", "2x4", machineType="ct6e-standard-8t"),
        ["big-0"],
        ("ct6e-standard-8t", 1, None, "us-east5-b", FIXED, "on-demand", None),
    ),
]


@pytest.mark.parametrize(
    ("slice_cfg", "pools", "expected"),
    [case[1:] for case in SHAPES],
    ids=[case[0] for case in SHAPES],
)
def test_other_shapes(slice_cfg: dict[str, Any], pools: list[str], expected: tuple) -> None:
    run = run_program_detailed(_config_with([slice_cfg]))
    tpu_pools = {n: r for n, r in _by_name(run, NODE_POOL).items() if n != "cpu"}
    assert sorted(tpu_pools) == pools
    for pool in pools:
        _check_tpu_pool(tpu_pools[pool].props, *expected)
    assert run.of_type(POLICY) == []


# ---------------------------------------------------------------------------- KubeRay objects

# (stack, kind, name): accelerator label, topology, hosts, chips per host, replicas, min, max
RAY_OBJECTS = {
    # dev's training slice scales to zero: its RayCluster starts with none and may take one.
    ("dev", RAY_CLUSTER, "train"): ("tpu-v6e-slice", "2x4", 2, 4, 0, 0, 1),
    ("dev", RAY_SERVICE, "serve"): ("tpu-v6e-slice", "2x2", 1, 4, 1, 1, 1),
    ("prod", RAY_CLUSTER, "train"): ("tpu-v6e-slice", "4x4", 4, 4, 2, 2, 2),
    ("prod", RAY_CLUSTER, "research"): ("tpu-v5p-slice", "2x2x4", 4, 4, 1, 1, 1),
    ("prod", RAY_SERVICE, "serve"): ("tpu-v6e-slice", "2x4", 1, 8, 1, 1, 2),
}


def _cluster_spec(resource: DeclaredResource) -> dict[str, Any]:
    spec = resource.props["spec"]
    return spec["rayClusterConfig"] if resource.type == RAY_SERVICE else spec


@pytest.mark.parametrize(
    ("stack", "kind", "name", "expected"),
    [(*key, expected) for key, expected in RAY_OBJECTS.items()],
    ids=[f"{stack}-{kind.rsplit(':', 1)[1]}-{name}" for stack, kind, name in RAY_OBJECTS],
)
def test_ray_object_spec(
    runs: dict[str, ProgramRun], stack: str, kind: str, name: str, expected: tuple
) -> None:
    accelerator, topology, hosts, chips, replicas, low, high = expected
    resource = _by_name(runs[stack], kind)[name]
    assert resource.props["apiVersion"] == "ray.io/v1"
    assert resource.props["metadata"]["namespace"] == "ray"
    spec = _cluster_spec(resource)
    assert spec["rayVersion"] == "2.60.0"
    assert spec["enableInTreeAutoscaling"] is (low != high)
    (group,) = spec["workerGroupSpecs"]
    assert group["numOfHosts"] == float(hosts)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (
        float(replicas),
        float(low),
        float(high),
    )
    pod = group["template"]["spec"]
    (worker,) = pod["containers"]
    image = load_stack(stack).ray_image
    assert worker["image"] == image
    requests, limits = worker["resources"]["requests"], worker["resources"]["limits"]
    assert requests["google.com/tpu"] == limits["google.com/tpu"] == str(chips)
    assert requests == limits
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": topology,
    }
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    head = spec["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu"}
    assert head["containers"][0]["image"] == image
    assert "google.com/tpu" not in head["containers"][0]["resources"]["limits"]
    assert "tolerations" not in head
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    # gRPC's fork handlers off on the head only (its Ray Client server; ray-project/ray#63202)
    head_env = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
    assert head_env["GRPC_ENABLE_FORK_SUPPORT"] == "0", head_env
    assert "RAYTPU_SLICE" in head_env, "the slice's environment is still added"
    assert "GRPC_ENABLE_FORK_SUPPORT" not in {e["name"] for e in worker.get("env", [])}


@pytest.mark.parametrize(
    ("stack", "chips_per_host"),
    [("dev", "4"), ("prod", "8")],
    ids=["dev-v6e-2x2", "prod-v6e-2x4-8t"],
)
def test_ray_service_serve_config(
    runs: dict[str, ProgramRun], stack: str, chips_per_host: str
) -> None:
    spec = _by_name(runs[stack], RAY_SERVICE)["serve"].props["spec"]
    assert isinstance(spec["serveConfigV2"], str)
    (app,) = yaml.safe_load(spec["serveConfigV2"])["applications"]
    assert (app["name"], app["import_path"], app["route_prefix"]) == (
        "serve",
        "workloads.serve:app",
        "/",
    )
    assert app["runtime_env"] == {
        "env_vars": {
            "RAYTPU_SERVE_TPU_PER_REPLICA": chips_per_host,
            "RAYTPU_CHECKPOINT_DIR": f"gs://ray-tpu-{stack}-ckpt/train",
        }
    }
    assert [d["name"] for d in app["deployments"]] == ["TextGenerator"]


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_exactly_the_expected_ray_objects(runs: dict[str, ProgramRun], stack: str) -> None:
    declared = {
        (stack, r.type, name)
        for kind in (RAY_CLUSTER, RAY_SERVICE)
        for name, r in _by_name(runs[stack], kind).items()
    }
    assert declared == {key for key in RAY_OBJECTS if key[0] == stack}


# ---------------------------------------------------------------------------- wiring


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_every_resource_has_a_component_parent(runs: dict[str, ProgramRun], stack: str) -> None:
    """``__main__`` only wires components: every cloud and Kubernetes resource is a child."""
    resources = runs[stack].resources
    components = {r.urn for r in resources if not r.custom}
    custom = [r for r in resources if r.custom]
    assert {r.type for r in custom} >= {CLUSTER, NODE_POOL, PROVIDER, RAY_CLUSTER, NAMESPACE}
    for resource in custom:
        assert resource.parent in components, resource.urn


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_ray_namespace_is_created_by_the_cluster_provider(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    (namespace,) = runs[stack].of_type(NAMESPACE)
    assert namespace.props["metadata"]["name"] == "ray"
    assert "ray-tpu:infra:KubernetesAccess" in namespace.urn
    for kind in (RAY_CLUSTER, RAY_SERVICE):
        for resource in runs[stack].of_type(kind):
            assert namespace.urn in resource.dependencies


def test_dev_stack_outputs(runs: dict[str, ProgramRun]) -> None:
    outputs = runs["dev"].outputs
    assert outputs["clusterName"] == "ray-tpu-dev"
    assert outputs["clusterEndpoint"]
    assert outputs["slices"] == {
        "train": {
            "generation": "v6e",
            "topology": "2x4",
            "machineType": "ct6e-standard-4t",
            "chipsPerHost": 4,
            "hosts": 2,
            "chips": 8,
            "count": 1,
            "nodePools": ["train-0"],
        },
        "serve": {
            "generation": "v6e",
            "topology": "2x2",
            "machineType": "ct6e-standard-4t",
            "chipsPerHost": 4,
            "hosts": 1,
            "chips": 4,
            "count": 1,
            "nodePools": ["serve-0"],
        },
    }
    assert outputs["rayClusters"] == {
        "train": {
            "namespace": "ray",
            "slice": "train",
            "headService": "train-head-svc",
            "dashboardPort": 8265,
            "auth": "kubernetes",  # a standalone RayCluster: Kubernetes-RBAC tokens
        },
    }
    assert outputs["rayServices"] == {
        "serve": {
            "namespace": "ray",
            "slice": "serve",
            "headService": "serve-head-svc",
            "serveService": "serve-serve-svc",
            "dashboardPort": 8265,
            "auth": "secret",  # KubeRay supports RBAC tokens for RayClusters only
            "authSecret": "serve-ray-auth",
        },
    }


def test_prod_stack_outputs(runs: dict[str, ProgramRun]) -> None:
    outputs = runs["prod"].outputs
    assert outputs["slices"]["train"]["nodePools"] == ["train-0", "train-1"]
    assert outputs["slices"]["research"]["hosts"] == 4
    assert sorted(outputs["rayClusters"]) == ["research", "train"]
    assert outputs["rayServices"]["serve"]["serveService"] == "serve-serve-svc"


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_kubeconfig_is_a_secret_using_the_gke_auth_plugin(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    run = runs[stack]
    assert run.secret_outputs == {"kubeconfig"}
    document = yaml.safe_load(run.outputs["kubeconfig"])
    (cluster,) = document["clusters"]
    assert cluster["cluster"]["server"] == f"https://{run.outputs['clusterEndpoint']}"
    assert cluster["cluster"]["certificate-authority-data"]
    (user,) = document["users"]
    assert user["user"]["exec"]["command"] == "gke-gcloud-auth-plugin"
    assert document["current-context"] == f"gke_ray-tpu-{stack}_us-east5_ray-tpu-{stack}"


def test_runs_repeat_in_one_process() -> None:
    first, first_outputs = run_stack("dev")
    second, second_outputs = run_stack("dev")
    # Registration order is asynchronous; what is registered must not change.
    assert sorted((r.urn, json.dumps(r.props, sort_keys=True)) for r in first) == sorted(
        (r.urn, json.dumps(r.props, sort_keys=True)) for r in second
    )
    assert first_outputs == second_outputs


def test_a_program_that_never_finishes_is_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    import pulumi

    from infra import offline

    monkeypatch.setattr(offline, "TIMEOUT_S", 0.5)

    from pulumi.runtime.sync_await import _sync_await

    pending: list[asyncio.Future] = []

    def never() -> None:
        pending.append(asyncio.get_event_loop().create_future())
        pulumi.export("never", pulumi.Output.from_input(pending[0]))

    run = offline._run(never, stack="dev", config={})
    # Settle the future we made, so no task outlives the test.
    pending[0].cancel()
    for _ in range(3):
        _sync_await(asyncio.sleep(0))
    assert isinstance(run.error, TimeoutError)
    assert "did not finish under mocks within" in str(run.error)
    # The runtime is reset (nothing left pending): the next run, with the usual limit, works.
    monkeypatch.undo()
    resources, _ = run_stack("dev")
    assert resources
