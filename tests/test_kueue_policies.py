"""The Kueue policies on the three-team stack (tests/data/Pulumi.teams.yaml): clean as declared,
and each one failing on a broken stack with a message that names the team, the shape and the fix."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.stack import parse_config
from infra.offline import DeclaredResource, run_program
from policies.evaluation import evaluate
from raytpu import kueue

TEAMS_STACK = Path(__file__).parent / "data" / "Pulumi.teams.yaml"
KUEUE_POLICIES = (
    "kueue-queue-label",
    "kueue-whole-slice-quota",
    "kueue-quota-capacity",
    "kueue-flavor-node-pools",
    "kueue-priority-class",
)


def _raw() -> dict[str, Any]:
    return yaml.safe_load(TEAMS_STACK.read_text())["config"]


@pytest.fixture(scope="module")
def declared() -> list[DeclaredResource]:
    resources, _ = run_program(parse_config(_raw()), stack="teams")
    return resources


def _find(resources: list[Any], kind: str, name: str) -> dict[str, Any]:
    (found,) = [
        r.props
        for r in resources
        if r.type.endswith(f":{kind}")
        # A RayJob's object name carries a digest of what it runs: <name>-<6 hex>.
        and re.fullmatch(rf"{name}(-[0-9a-f]{{6}})?", r.props.get("metadata", {}).get("name", ""))
    ]
    return found


def test_the_teams_stack_is_clean(declared: list[DeclaredResource]) -> None:
    assert [(v.policy, v.message) for v in evaluate(declared)] == []


def _drop_queue_label(resources: list[Any]) -> None:
    del _find(resources, "RayJob", "nightly")["metadata"]["labels"][kueue.QUEUE_LABEL]


def _wrong_queue(resources: list[Any]) -> None:
    _find(resources, "RayJob", "nightly")["metadata"]["labels"][kueue.QUEUE_LABEL] = "research"


def _fractional_quota(resources: list[Any]) -> None:
    queue = _find(resources, "ClusterQueue", "research")
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 24.0


def _fractional_borrowing(resources: list[Any]) -> None:
    queue = _find(resources, "ClusterQueue", "batch")
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] = "20"


def _flavor_without_pool(resources: list[Any]) -> None:
    labels = _find(resources, "ResourceFlavor", "v5p-2x2x4-4t")["spec"]["nodeLabels"]
    labels["cloud.google.com/gke-spot"] = "true"  # the v5p pool is a reservation, not Spot


def _unknown_priority(resources: list[Any]) -> None:
    labels = _find(resources, "RayJob", "paper-run")["metadata"]["labels"]
    labels[kueue.PRIORITY_LABEL] = "urgent"


class _Mutable:
    """A declared resource with props we may break."""

    def __init__(self, r: DeclaredResource) -> None:
        self.type, self.name, self.urn = r.type, r.name, r.urn
        self.props = copy.deepcopy(r.props)


BROKEN: dict[str, tuple[Callable[[list[Any]], None], str, list[str]]] = {
    "no-queue-label": (
        _drop_queue_label,
        "kueue-queue-label",
        [
            "RayJob/nightly-",
            "(namespace batch, team batch, v6e 4x4)",
            "has no kueue.x-k8s.io/queue-name",
            "add the label kueue.x-k8s.io/queue-name: batch",
        ],
    ),
    "queue-of-another-namespace": (
        _wrong_queue,
        "kueue-queue-label",
        ["RayJob/nightly", "team batch", "'research' names no LocalQueue", "use one of: batch"],
    ),
    "quota-not-whole-slices": (
        _fractional_quota,
        "kueue-whole-slice-quota",
        [
            "ClusterQueue/research (team research), flavor v6e-4x4-4t (v6e 4x4, 16 chips a slice)",
            "nominalQuota 24 chips is 1.5 slices",
            "set 16 (1 slice) or 32 (2 slices)",
        ],
    ),
    "borrowing-not-whole-slices": (
        _fractional_borrowing,
        "kueue-whole-slice-quota",
        ["team batch", "v6e 4x4", "borrowingLimit 20 chips is 1.25 slices", "set 16 (1 slice)"],
    ),
    "flavor-matches-no-pool": (
        _flavor_without_pool,
        "kueue-flavor-node-pools",
        [
            "ResourceFlavor/v5p-2x2x4-4t (v5p 2x2x4, used by research)",
            "match no TPU node pool",
            "add a slice of that shape and provisioning, or fix the labels",
        ],
    ),
    "priority-class-missing": (
        _unknown_priority,
        "kueue-priority-class",
        [
            "RayJob/paper-run-",
            "(team research, v6e 4x4)",
            "'urgent' names no WorkloadPriorityClass (declared: high, low, normal)",
            "declare 'urgent' in ray-tpu:priorityClasses",
        ],
    ),
}


@pytest.mark.parametrize(("break_it", "policy", "parts"), BROKEN.values(), ids=BROKEN)
def test_each_policy_fails_on_a_broken_stack(
    declared: list[DeclaredResource],
    break_it: Callable[[list[Any]], None],
    policy: str,
    parts: list[str],
) -> None:
    resources = [_Mutable(r) for r in declared]
    break_it(resources)
    found = [v for v in evaluate(resources) if v.policy in KUEUE_POLICIES]
    assert [v.policy for v in found] == [policy], [v.message for v in found]
    assert found[0].mandatory
    for part in parts:
        assert part in found[0].message


def test_oversubscribed_quotas_from_the_stack_config() -> None:
    """A stack whose teams' nominal quotas exceed the pools: the config is valid Kueue, the
    policy blocks it (a nominal quota is a promise)."""
    raw = _raw()
    raw["ray-tpu:teams"][2]["quotas"][0]["slices"] = 2  # batch: 2 + 2 + 1 > 4 v6e 4x4 slices
    resources, _ = run_program(parse_config(raw), stack="teams")
    found = [v for v in evaluate(resources) if v.policy in KUEUE_POLICIES]
    assert [v.policy for v in found] == ["kueue-quota-capacity"]
    message = found[0].message
    for part in (
        "flavor v6e-4x4-4t (v6e 4x4)",
        "add up to 5 slices (batch 2, research 2, serving 1)",
        "the node pools of that flavor hold 4 (pools: train-0, train-1, train-2, train-3)",
        "lower the quotas (ray-tpu:teams[].quotas) or add slices",
    ):
        assert part in message


def test_bare_manifests_skip_the_pool_rules(declared: list[DeclaredResource]) -> None:
    """`raytpu check` on Kueue and KubeRay manifests alone: no pools, no capacity verdict."""
    resources = [_Mutable(r) for r in declared if not r.type.startswith("gcp:")]
    _flavor_without_pool(resources)
    assert [v for v in evaluate(resources) if v.policy in KUEUE_POLICIES] == []
