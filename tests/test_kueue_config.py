"""ray-tpu:teams and ray-tpu:priorityClasses: good values, and each bad one named with its key
path, the bad value and the valid values, before anything is declared."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.config.stack import parse_config
from infra.config.teams import team_of

TEAMS_STACK = Path(__file__).parent / "data" / "Pulumi.teams.yaml"
RAW = yaml.safe_load(TEAMS_STACK.read_text())["config"]


def _with(change: Callable[[dict[str, Any]], object]) -> dict[str, Any]:
    raw = copy.deepcopy(RAW)
    change(raw)
    return raw


def test_teams_parse() -> None:
    stack = parse_config(RAW)
    assert [t.name for t in stack.teams] == ["research", "serving", "batch"]
    research = stack.teams[0]
    assert (research.namespace, research.cohort, research.priority) == ("research", "tpu", "normal")
    assert [(q.flavor, q.slices, q.lending_limit) for q in research.quotas] == [
        ("v6e-4x4-4t", 2, 1),
        ("v5p-2x2x4-4t", 2, None),
    ]
    assert [p.value for p in stack.priority_classes] == [100, 500, 1000]
    owners = {o.name: team_of(stack.teams, o).name for o in stack.ray_jobs}
    assert owners == {"nightly": "batch", "paper-run": "research"}
    assert "batch" in stack.namespaces and "ray" in stack.namespaces


def teams(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return raw["ray-tpu:teams"]


BAD = {
    "unknown-priority": (
        lambda r: teams(r)[0].update(priority="urgent"),
        "ray-tpu:teams[0].priority: 'urgent' is not valid; valid: low, normal, high",
    ),
    "unknown-slice": (
        lambda r: teams(r)[0]["quotas"][0].update(slice="gpu"),
        "ray-tpu:teams[0].quotas[0].slice: 'gpu' is not valid; valid: train, research, serve",
    ),
    "fractional-slices": (
        lambda r: teams(r)[0]["quotas"][0].update(slices=1.5),
        "ray-tpu:teams[0].quotas[0].slices: 1.5 is not valid; valid: an integer 0..10000 (whole slices)",
    ),
    "lending-above-quota": (
        lambda r: teams(r)[0]["quotas"][0].update(lendingLimit=3),
        "ray-tpu:teams[0].quotas[0].lendingLimit: 3 is not valid; valid: an integer 0..2",
    ),
    "borrowing-without-cohort": (
        lambda r: teams(r)[2].pop("cohort"),
        "ray-tpu:teams[2].cohort: is required; valid: a cohort name (borrowing and lending need a cohort)",
    ),
    "same-flavor-twice": (
        lambda r: teams(r)[2]["quotas"].append({"slice": "train", "slices": 1}),
        "flavor v6e-4x4-4t: add the slices up in one entry",
    ),
    "shared-namespace": (
        lambda r: teams(r)[2].update(namespace="research"),
        "ray-tpu:teams[2].namespace: 'research' is not valid; valid: a namespace of one team only",
    ),
    "duplicate-team": (
        lambda r: teams(r)[2].update(name="research", namespace="b2"),
        "ray-tpu:teams[2].name: 'research' is not valid; valid: a name not used elsewhere",
    ),
    "bad-preemption": (
        lambda r: teams(r)[0].update(preemption={"reclaimWithinCohort": "Sometimes"}),
        "ray-tpu:teams[0].preemption.reclaimWithinCohort: 'Sometimes' is not valid; valid: Never, LowerPriority, Any",
    ),
    "unknown-object-team": (
        lambda r: r["ray-tpu:rayJobs"][1].update(team="physics"),
        "ray-tpu:rayJobs[1].team: 'physics' is not valid; valid: research, serving, batch",
    ),
    "unknown-object-priority": (
        lambda r: r["ray-tpu:rayJobs"][1].update(priority="urgent"),
        "ray-tpu:rayJobs[1].priority: 'urgent' is not valid; valid: low, normal, high",
    ),
    "priority-without-team": (
        lambda r: r["ray-tpu:rayJobs"][1].pop("team"),
        "ray-tpu:rayJobs[1].team: is required; valid: research, serving, batch (a priority needs a team's queue)",
    ),
    "team-object-autoscaled": (
        lambda r: r["ray-tpu:rayClusters"][0].update(minReplicas=0),
        "ray-tpu:rayClusters[0].maxReplicas: 1 is not valid; valid: 0 (= minReplicas) (team research's objects are admitted by Kueue, which refuses in-tree autoscaling",
    ),
    "object-on-a-flavor-without-quota": (
        lambda r: r["ray-tpu:rayJobs"][0].update(slice="research"),
        "ray-tpu:rayJobs[0].slice: 'research' is not valid; valid: train (team batch has no quota of flavor v5p-2x2x4-4t",
    ),
    "priority-value-out-of-range": (
        lambda r: r["ray-tpu:priorityClasses"][0].update(value=2_000_000_000),
        "ray-tpu:priorityClasses[0].value: 2000000000 is not valid",
    ),
    "unknown-team-key": (
        lambda r: teams(r)[0].update(quota=1),
        "ray-tpu:teams[0].quota: 'quota' is not valid; valid: name, namespace, cohort, priority, quotas, preemption (unknown key)",
    ),
}


@pytest.mark.parametrize(("change", "message"), BAD.values(), ids=BAD)
def test_bad_team_config(change: Callable[[dict[str, Any]], object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_with(change))
    assert any(message in e for e in caught.value.errors), caught.value.errors
