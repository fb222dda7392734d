"""``ray-tpu:notebooks``: JupyterLab developer environments, next to the Ray clusters.

Present (even as ``{}``): one notebook per team when the stack has ``ray-tpu:teams`` (each on
its team's first RayCluster; default every team that has one, ``teams`` names them), else one for the stack (on ``rayCluster``,
default the first RayCluster). Every rule is checked here, before anything is declared."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.config.gcp_rules import image_check
from infra.config.notebook_iap import parse_notebook_iap
from infra.config.notebook_schema import NotebookConfig, NotebooksConfig
from infra.config.reader import Problems, Section, resources
from infra.config.schema import NAMESPACE, RayClusterConfig, WorkerResources
from infra.config.team_schema import TeamConfig
from infra.config.teams import team_of

PATH = f"{NAMESPACE}:notebooks"
_KEYS = ("rayCluster", "teams", "image", "resources", "iap")
DEFAULT_RESOURCES = WorkerResources("2", "8Gi")


def _team_notebooks(
    s: Section, teams: Sequence[TeamConfig], clusters: Sequence[RayClusterConfig]
) -> list[NotebookConfig]:
    first = {}
    for cluster in clusters:
        team = team_of(teams, cluster)
        if team is not None:
            first.setdefault(team.name, cluster)
    names = [t.name for t in teams]
    if "teams" not in s.raw and not first:
        s.problems.bad(
            s.sub("teams"),
            None,
            f"a list of team names with a RayCluster ({', '.join(names)} have none)",
            f"a notebook attaches to its team's RayCluster: add one to {NAMESPACE}:rayClusters",
        )
    chosen = s.get(
        "teams",
        list,
        list(first),
        valid=f"a non-empty list of team names: {', '.join(names)}",
        check=lambda v: bool(v) and all(isinstance(n, str) for n in v),
    )
    found = []
    for index, name in enumerate(chosen or ()):
        if name not in names:
            s.problems.bad(f"{s.sub('teams')}[{index}]", name, ", ".join(names))
            continue
        if name not in first:
            s.problems.bad(
                f"{s.sub('teams')}[{index}]",
                name,
                ", ".join(first) or "(no team has a RayCluster)",
                f"team {name} has no RayCluster for its notebook to attach to: add one to "
                f"{NAMESPACE}:rayClusters with team: {name}",
            )
            continue
        team, cluster = next(t for t in teams if t.name == name), first[name]
        found.append(
            NotebookConfig(f"{name}-notebook", cluster.namespace, cluster.name, name, team.name)
        )
    return found


def _stack_notebook(s: Section, clusters: Sequence[RayClusterConfig]) -> list[NotebookConfig]:
    names = [c.name for c in clusters]
    valid = ", ".join(names) or f"(no RayCluster: declare one in {NAMESPACE}:rayClusters)"
    name = s.get("rayCluster", str, names[0] if names else None, valid=valid)
    if name is None and not names:
        s.problems.bad(s.sub("rayCluster"), None, valid, "a notebook attaches to a RayCluster")
        return []
    cluster = next((c for c in clusters if c.name == name), None)
    if cluster is None:
        if name is not None:
            s.problems.bad(s.sub("rayCluster"), name, valid)
        return []
    return [NotebookConfig("notebook", cluster.namespace, cluster.name)]


def parse_notebooks(
    problems: Problems,
    raw: Any,
    teams: Sequence[TeamConfig],
    clusters: Sequence[RayClusterConfig],
    ray_version: str | None,
) -> NotebooksConfig | None:
    """None when the section is absent (no notebooks) or invalid (reported in ``problems``)."""
    if raw is None:
        return None
    before = len(problems.errors)
    s = Section(problems, PATH, raw, _KEYS)
    if not s.ok:
        return None
    if teams:
        if "rayCluster" in s.raw:
            problems.bad(
                s.sub("rayCluster"),
                s.raw["rayCluster"],
                "unset when ray-tpu:teams is declared",
                "each team's notebook attaches to that team's first RayCluster; pick teams "
                "with notebooks.teams",
            )
        notebooks = _team_notebooks(s, teams, clusters)
    else:
        if "teams" in s.raw:
            problems.bad(s.sub("teams"), s.raw["teams"], "unset: the stack has no ray-tpu:teams")
        notebooks = _stack_notebook(s, clusters)
    image = s.get("image", str, None, valid="a container image reference with jupyterlab in it")
    if image is not None and not image_check(problems, s.sub("image"), image, ray_version):
        image = None
    limits = resources(s, "resources", DEFAULT_RESOURCES)
    iap = parse_notebook_iap(problems, s.sub("iap"), s.raw.get("iap"), notebooks)
    if len(problems.errors) > before:
        return None
    return NotebooksConfig(tuple(notebooks), image, limits.cpu, limits.memory, iap)
