"""Deploys that respect TPU capacity, under mocks: what waits on which node pool, what a pool
that cannot be created (a stockout) holds back, and what a second ``pulumi up`` that only bumps
the image tag would do to running training (``tests/preview_diff.py`` models the engine)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from preview_diff import plan

from infra.config.schema import ConfigError
from infra.config.stack import load_stack, parse_config
from infra.offline import (
    STOCKOUT,
    DeclaredResource,
    ProgramRun,
    held_back,
    run_program_detailed,
    run_with_failures,
)

REPO = Path(__file__).resolve().parents[1]
NODE_POOL = "gcp:container/nodePool:NodePool"
PROVIDER = "pulumi:providers:kubernetes"
RAY_TYPES = {f"kubernetes:ray.io/v1:{kind}" for kind in ("RayCluster", "RayService", "RayJob")}
TPU_SLICE = "ray-tpu:infra:TpuSlice"


def _raw(stack: str) -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())["config"])


def _with_job(raw: dict[str, Any], **job: Any) -> dict[str, Any]:
    """dev with a RayJob on a second ``train`` slice."""
    for item in raw["ray-tpu:slices"]:
        if item["name"] == "train":
            item["count"] = 2
    raw["ray-tpu:rayJobs"] = [{"name": "train-run", "slice": "train", "replicas": 1, **job}]
    return raw


def _run(raw: dict[str, Any]) -> ProgramRun:
    return run_program_detailed(parse_config(raw), stack="dev")


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    return {
        "dev": run_program_detailed(load_stack("dev"), stack="dev"),
        "prod": run_program_detailed(load_stack("prod"), stack="prod"),
        "dev+job": _run(_with_job(_raw("dev"), args=["--steps", "200"])),
    }


def _slice_of(run: ProgramRun, pool: DeclaredResource) -> str:
    """The slice a node pool belongs to (its TpuSlice component: ``slice-<name>``)."""
    (parent,) = [r for r in run.resources if r.urn == pool.parent]
    assert parent.type == TPU_SLICE, pool.name
    return parent.name.removeprefix("slice-")


def _ray_objects(run: ProgramRun) -> list[DeclaredResource]:
    return [r for r in run.resources if r.type in RAY_TYPES]


def _tpu_pools(run: ProgramRun) -> list[DeclaredResource]:
    return [p for p in run.of_type(NODE_POOL) if p.name != "cpu-pool"]


STACKS = ["dev", "prod", "dev+job"]


# ---------------------------------------------------------------------------- who waits on what


@pytest.mark.parametrize("stack", STACKS, ids=STACKS)
def test_nothing_but_a_slice_s_own_ray_objects_waits_on_its_pools(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    run = runs[stack]
    (provider,) = run.of_type(PROVIDER)
    pools = {p.urn: p for p in run.of_type(NODE_POOL)}
    assert not set(provider.dependencies) & set(pools)  # the provider waits for the cluster only
    (cpu,) = [p for p in pools.values() if p.name == "cpu-pool"]
    for obj in _ray_objects(run):
        on = obj.props["metadata"]["labels"]["ray-tpu/slice"]
        waited = {pools[urn].name for urn in obj.dependencies if urn in pools}
        expected = {p.name for p in _tpu_pools(run) if _slice_of(run, p) == on}
        assert waited == expected | {cpu.name}, obj.name
    others = [r for r in run.resources if r.type not in RAY_TYPES and r.urn not in pools]
    for resource in others:  # Secrets, Roles, NetworkPolicies... wait on no TPU pool
        tpu = {urn for urn in resource.dependencies if urn in pools and urn != cpu.urn}
        assert not tpu, resource.name


# ---------------------------------------------------------------------------- a stockout


@pytest.mark.parametrize("stack", STACKS, ids=STACKS)
def test_a_tpu_pool_that_cannot_be_created_holds_back_only_its_slice_s_ray_objects(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    run = runs[stack]
    by_urn = {r.urn: r for r in run.resources}
    pools = _tpu_pools(run)
    assert len(pools) >= 2, "a stockout test needs a second pool that comes up"
    for pool in pools:
        lost = held_back(run.resources, [pool.name])
        on = _slice_of(run, pool)
        expected = {pool.urn} | {
            r.urn for r in _ray_objects(run) if r.props["metadata"]["labels"]["ray-tpu/slice"] == on
        }
        assert lost == expected, sorted(by_urn[u].name for u in lost ^ expected)
        landed = [r for r in run.resources if r.custom and r.urn not in lost]
        assert {r.type for r in landed} >= {NODE_POOL, PROVIDER, "kubernetes:core/v1:Namespace"}


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_a_pool_whose_creation_fails_under_mocks_takes_nothing_else_down_with_it(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    """The mock cloud refuses one TPU pool (a stockout): the program fails with that error and
    nothing that waits on the pool is created; what does not wait on it is what
    ``held_back`` leaves (Pulumi's SDK stops registering after the first failure, so a plain
    ``pulumi up`` lands only part of it; ``--continue-on-error`` lands all of it)."""
    full = runs[stack]
    for pool in _tpu_pools(full):
        failed = run_with_failures(load_stack(stack), [pool.name], stack=stack)
        assert failed.error is not None and STOCKOUT in str(failed.error)
        declared = {r.urn for r in failed.resources if r.custom}
        waits = held_back(full.resources, [pool.name]) - {pool.urn}
        assert waits and not waits & declared, pool.name  # its Ray objects were never created
        assert declared <= {r.urn for r in full.resources if r.custom}


def test_a_failed_cpu_pool_holds_back_the_ray_objects_but_not_the_tpu_pools(
    runs: dict[str, ProgramRun],
) -> None:
    run = runs["prod"]
    lost = held_back(run.resources, ["cpu-pool"])
    names = {r.name for r in run.resources if r.urn in lost}
    assert {r.urn for r in _ray_objects(run)} <= lost
    assert not {p.urn for p in _tpu_pools(run)} & lost
    assert "k8s" not in names  # the provider and the namespaces land


def test_held_back_can_fail(runs: dict[str, ProgramRun]) -> None:
    """The closure follows dependencies: a resource every Ray object waits on takes them all."""
    run = runs["dev"]
    (namespace,) = run.of_type("kubernetes:core/v1:Namespace")
    lost = held_back(run.resources, [namespace.name])
    assert {r.urn for r in _ray_objects(run)} <= lost
    assert held_back(run.resources, ["no-such-resource"]) == set()


# ---------------------------------------------------------------------------- deploys and jobs


def _tagged(raw: dict[str, Any], tag: str) -> dict[str, Any]:
    return {**copy.deepcopy(raw), "ray-tpu:imageTag": tag}


def test_an_image_bump_leaves_every_ray_job_in_place(runs: dict[str, ProgramRun]) -> None:
    raw = _with_job(_raw("dev"), args=["--steps", "200"])
    before, after = _run(_tagged(raw, "0123456789ab")), _run(_tagged(raw, "ba9876543210"))
    steps = plan(before.resources, after.resources)
    by_urn = {r.urn: r for r in after.resources}
    jobs = [u for u in steps if by_urn[u].type == "kubernetes:ray.io/v1:RayJob"]
    assert jobs and all(steps[u] == "same" for u in jobs), steps
    # The image did change everywhere else: the long-lived objects are updated in place.
    updated = {by_urn[u].type for u, s in steps.items() if s == "update"}
    assert updated == {"kubernetes:ray.io/v1:RayCluster", "kubernetes:ray.io/v1:RayService"}
    assert "replace" not in steps.values() and "delete" not in steps.values()


def test_a_changed_job_is_a_new_run_and_the_old_one_is_left_to_finish() -> None:
    raw = _with_job(_raw("dev"), args=["--steps", "200"])
    changed = _with_job(_raw("dev"), args=["--steps", "400"])
    before, after = _run(raw), _run(changed)
    steps = plan(before.resources, after.resources)
    (old,) = [r for r in before.resources if r.type == "kubernetes:ray.io/v1:RayJob"]
    (new,) = [r for r in after.resources if r.type == "kubernetes:ray.io/v1:RayJob"]
    assert steps[new.urn] == "replace"
    assert old.props["metadata"]["name"] != new.props["metadata"]["name"]
    assert old.retain_on_delete  # the replaced RayJob stays in the cluster and finishes
    others = {u: s for u, s in steps.items() if u != new.urn}
    assert set(others.values()) == {"same"}, others


def test_the_plan_sees_renames_and_removals() -> None:
    """The diff model can fail: dropping a job forgets it, dropping a slice deletes its pool."""
    raw = _with_job(_raw("dev"), args=["--steps", "200"])
    before = _run(raw)
    steps = plan(before.resources, _run(_raw("dev")).resources)
    (job,) = [r for r in before.resources if r.type == "kubernetes:ray.io/v1:RayJob"]
    assert steps[job.urn] == "forget"
    (pool,) = [p for p in before.of_type(NODE_POOL) if p.name == "slice-train-1"]
    assert steps[pool.urn] == "delete"


# ---------------------------------------------------------------------------- maintenance


@pytest.mark.parametrize("stack", ["dev", "prod"], ids=["dev", "prod"])
def test_no_node_pool_is_upgraded_under_a_job_by_default(
    runs: dict[str, ProgramRun], stack: str
) -> None:
    (cluster,) = runs[stack].of_type("gcp:container/cluster:Cluster")
    policy = cluster.props["maintenancePolicy"]
    assert policy["recurringWindow"] == {
        "startTime": "2026-01-03T00:00:00Z",
        "endTime": "2026-01-03T08:00:00Z",
        "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU",
    }
    (exclusion,) = policy["maintenanceExclusions"]
    assert exclusion["exclusionOptions"] == {
        "scope": "NO_MINOR_OR_NODE_UPGRADES",
        "endTimeBehavior": "UNTIL_END_OF_SUPPORT",
    }
    assert "endTime" not in exclusion


def _maintained(maintenance: Any) -> dict[str, Any]:
    raw = _raw("dev")
    raw["ray-tpu:cluster"]["maintenance"] = maintenance
    return raw


def test_a_stack_s_own_window_and_exclusions_reach_the_cluster() -> None:
    window = {"start": "2027-01-04T22:00:00Z", "end": "2027-01-05T04:00:00Z"}
    freeze = {"name": "launch", "scope": "NO_UPGRADES"}
    freeze |= {"start": "2027-02-01T00:00:00Z", "end": "2027-02-20T00:00:00Z"}
    run = _run(
        _maintained({"window": {**window, "recurrence": "FREQ=DAILY"}, "exclusions": [freeze]})
    )
    (cluster,) = run.of_type("gcp:container/cluster:Cluster")
    policy = cluster.props["maintenancePolicy"]
    assert policy["recurringWindow"]["recurrence"] == "FREQ=DAILY"
    assert policy["maintenanceExclusions"] == [
        {
            "exclusionName": "launch",
            "startTime": "2027-02-01T00:00:00Z",
            "endTime": "2027-02-20T00:00:00Z",
            "exclusionOptions": {"scope": "NO_UPGRADES"},
        }
    ]
    (cluster,) = _run(_maintained({"exclusions": []})).of_type("gcp:container/cluster:Cluster")
    assert "maintenanceExclusions" not in cluster.props["maintenancePolicy"]  # GKE's choice


M = "ray-tpu:cluster.maintenance"
W = {
    "start": "2027-01-02T00:00:00Z",
    "end": "2027-01-02T08:00:00Z",
    "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU",
}
X = {
    "name": "x",
    "start": "2027-01-01T00:00:00Z",
    "end": "2027-01-10T00:00:00Z",
    "scope": "NO_UPGRADES",
}
BAD_MAINTENANCE = [
    ("not-utc", {"window": {**W, "start": "2027-01-02 00:00"}}, f"{M}.window.start: '2027-01-02 00:00' is not valid; valid: an RFC 3339 UTC time"),
    ("short-window", {"window": {**W, "end": "2027-01-02T03:00:00Z"}}, f"{M}.window.end: '2027-01-02T03:00:00Z' is not valid; valid: 4 to 24 hours after start"),
    ("too-little-window", {"window": {**W, "end": "2027-01-02T05:00:00Z", "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU"}}, f"{M}.window.recurrence: 'FREQ=WEEKLY;BYDAY=SA,SU' is not valid; valid: one giving at least 48 hours of window in 32 days (this gives 46)"),
    ("bad-recurrence", {"window": {**W, "recurrence": "FREQ=MONTHLY"}}, f"{M}.window.recurrence: 'FREQ=MONTHLY' is not valid; valid: FREQ=DAILY or FREQ=WEEKLY;BYDAY=<days>"),
    ("bad-scope", {"exclusions": [{**X, "scope": "NO_PATCHES"}]}, f"{M}.exclusions[0].scope: 'NO_PATCHES' is not valid; valid: NO_UPGRADES, NO_MINOR_UPGRADES, NO_MINOR_OR_NODE_UPGRADES"),
    ("freeze-too-long", {"exclusions": [{**X, "end": "2027-03-01T00:00:00Z"}]}, f"{M}.exclusions[0].end: '2027-03-01T00:00:00Z' is not valid; valid: at most 30 days after start"),
    ("end-before-start", {"exclusions": [{**X, "end": "2026-12-01T00:00:00Z"}]}, f"{M}.exclusions[0].end: '2026-12-01T00:00:00Z' is not valid; valid: a time after start (2027-01-01T00:00:00Z)"),
    ("no-end", {"exclusions": [{k: v for k, v in X.items() if k != "end"}]}, f"{M}.exclusions[0].end: is required; valid: an RFC 3339 UTC time"),
    ("until-eos-no-upgrades", {"exclusions": [{**{k: v for k, v in X.items() if k != "end"}, "untilEndOfSupport": True}]}, f"{M}.exclusions[0].scope: 'NO_UPGRADES' is not valid; valid: NO_MINOR_UPGRADES, NO_MINOR_OR_NODE_UPGRADES"),
    ("until-eos-with-end", {"exclusions": [{**X, "scope": "NO_MINOR_UPGRADES", "untilEndOfSupport": True}]}, f"{M}.exclusions[0].end: '2027-01-10T00:00:00Z' is not valid; valid: absent with untilEndOfSupport: true"),
    ("duplicate-names", {"exclusions": [X, X]}, f"{M}.exclusions: 'x' is not valid; valid: exclusion names that differ"),
    ("unknown-key", {"windows": W}, f"{M}.windows: 'windows' is not valid; valid: window, exclusions"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("maintenance", "message"),
    [b[1:] for b in BAD_MAINTENANCE],
    ids=[b[0] for b in BAD_MAINTENANCE],
)
def test_a_bad_maintenance_policy_is_a_clear_error(maintenance: Any, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(_maintained(maintenance))
    assert message in str(error.value)
