"""Queued provisioning as a slice provisioning mode: the node pool GKE's Dynamic Workload
Scheduler grows through ProvisioningRequests, and the Kueue admission check on the team's queue
that creates them (the teams stack with a ``queued`` slice added, under mocks and the CRDs)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.config.stack import parse_config
from infra.manifests import kueue as kueue_spec
from infra.offline import ProgramRun, run_program_detailed
from raytpu import kueue

TEAMS_STACK = Path(__file__).parent / "data" / "Pulumi.teams.yaml"
KUEUE_TYPE = "kubernetes:kueue.x-k8s.io/v1beta2:"
QUEUED_FLAVOR = "v6e-4x4-4t-queued"


def _raw() -> dict[str, Any]:
    """The teams stack with two v6e 4x4 slices provisioned ``queued``, quota of team batch, and
    a RayJob of batch on them."""
    raw = copy.deepcopy(yaml.safe_load(TEAMS_STACK.read_text())["config"])
    raw["ray-tpu:slices"].append(
        {
            "name": "later",
            "generation": "v6e",
            "topology": "4x4",
            "zone": "us-east5-b",
            "count": 2,
            "provisioning": "queued",
        }
    )
    (batch,) = [t for t in raw["ray-tpu:teams"] if t["name"] == "batch"]
    batch["quotas"].append({"slice": "later", "slices": 2})
    raw["ray-tpu:rayJobs"].append(
        {"name": "sweep", "namespace": "batch", "slice": "later", "replicas": 1}
    )
    return raw


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program_detailed(parse_config(_raw()), stack="teams")


def _kueue(run: ProgramRun, kind: str) -> dict[str, Any]:
    return {
        r.props["metadata"]["name"]: {k: v for k, v in r.props.items() if k != "__defaults"}
        for r in run.of_type(KUEUE_TYPE + kind)
    }


def test_a_queued_pool_has_the_flags_gke_needs(run: ProgramRun) -> None:
    pools = {p.props["name"]: p for p in run.of_type("gcp:container/nodePool:NodePool")}
    for name in ("later-0", "later-1"):
        props = pools[name].props
        assert props["queuedProvisioning"] == {"enabled": True}
        assert props["management"] == {"autoRepair": False, "autoUpgrade": True}
        assert props["nodeConfig"]["flexStart"] is True
        assert props["nodeConfig"]["reservationAffinity"] == {
            "consumeReservationType": "NO_RESERVATION"
        }
        assert props["initialNodeCount"] == 0.0  # starts empty; a ProvisioningRequest grows it
        assert props["autoscaling"]["maxNodeCount"] == 4.0  # one whole v6e 4x4 slice
    for name in ("train-0", "serve-0"):  # the others are untouched
        assert "queuedProvisioning" not in pools[name].props
        assert pools[name].props["management"]["autoRepair"] is True


def test_the_team_s_queue_admits_the_queued_flavor_through_a_provisioning_request(
    run: ProgramRun,
) -> None:
    (config,) = _kueue(run, "ProvisioningRequestConfig").values()
    assert config["spec"] == {
        "provisioningClassName": "queued-provisioning.gke.io",
        "managedResources": ["google.com/tpu"],
    }
    (check,) = _kueue(run, "AdmissionCheck").values()
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["spec"]["parameters"] == {
        "apiGroup": "kueue.x-k8s.io",
        "kind": "ProvisioningRequestConfig",
        "name": config["metadata"]["name"],
    }
    queues = _kueue(run, "ClusterQueue")
    assert queues["batch"]["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": check["metadata"]["name"], "onFlavors": [QUEUED_FLAVOR]}]
    }
    for team in ("research", "serving"):  # no queued quota, no check
        assert "admissionChecksStrategy" not in queues[team]["spec"]
    assert QUEUED_FLAVOR in _kueue(run, "ResourceFlavor")
    # The check exists before the queue that names it.
    urns = {r.props["metadata"]["name"]: r.urn for r in run.of_type(KUEUE_TYPE + "AdmissionCheck")}
    (batch,) = [r for r in run.of_type(KUEUE_TYPE + "ClusterQueue") if r.name.endswith("batch")]
    assert set(urns.values()) <= set(batch.dependencies)


@pytest.mark.crds("kueue")
def test_the_queued_objects_are_valid_against_kueue_s_crds(run: ProgramRun) -> None:
    objects = [
        obj
        for kind in ("ProvisioningRequestConfig", "AdmissionCheck", "ClusterQueue")
        for obj in _kueue(run, kind).values()
    ]
    assert len(objects) == 2 + 3
    for obj in objects:
        assert kueue.validate_object(obj) == [], obj["metadata"]["name"]
    broken = copy.deepcopy(_kueue(run, "AdmissionCheck"))
    (check,) = broken.values()
    del check["spec"]["controllerName"]
    assert kueue.validate_object(check) != []  # the check can fail


def test_no_queued_slice_no_admission_check() -> None:
    raw = yaml.safe_load(TEAMS_STACK.read_text())["config"]
    assert kueue_spec.queued_provisioning(parse_config(raw)) == []


BAD = [
    ("object-without-team", lambda raw: raw["ray-tpu:rayJobs"][-1].update(namespace="ray"),
     "ray-tpu:rayJobs[2].team: is required; valid: research, serving, batch (slice 'later' is provisioned queued"),
    ("v4-not-offered", lambda raw: raw["ray-tpu:slices"][-1].update(generation="v4", topology="2x2x4"),
     "ray-tpu:slices[3].provisioning: 'queued' is not valid; valid: on-demand, spot, reservation (GKE does not offer flex-start for v4 TPUs)"),
    ("fixed-size", lambda raw: raw["ray-tpu:slices"][-1].update(scaleToZero=False),
     "ray-tpu:slices[3].scaleToZero: False is not valid; valid: true (queued pools start empty"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_queued_slice_is_a_clear_error(change: Any, message: str) -> None:
    raw = _raw()
    change(raw)
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert message in str(error.value)
