"""``workloads.ray_compat``: the one module that reaches Ray names outside Ray's stable API.

Every other module of the project (and the benchmarks and tools) is read as source: none may
import or name what that module wraps. The version policy follows from it: the floor is no older
than any path needs, and the pinned Ray is one the upgrade matrix passed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from raytpu import ray_versions
from workloads import ray_compat

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    path
    for folder in ("workloads", "raytpu", "raytpu_cli", "infra", "policies", "bench", "tools")
    for path in (REPO / folder).rglob("*.py")
    if path != REPO / "workloads" / "ray_compat.py"
)

# (what, how it shows in an AST node)
IMPORTED = (
    "ray.util.tpu",
    "ray._private",
    "ray._raylet",
    "ray.core.generated",
    "ray.cluster_utils",
    "ray.util.placement_group_table",
)
NAMES = ("placement_group_table", "_raylet", "get_draining_nodes", "drain_node")
KEYWORDS = ("bundle_label_selector", "use_tpu", "max_preemption_failures", "label_selector")


def _trees() -> list[tuple[Path, ast.AST]]:
    return [(path, ast.parse(path.read_text(), filename=str(path))) for path in SOURCES]


TREES = _trees()


def _found(check) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
        for path, tree in TREES
        for node in ast.walk(tree)
        if check(node)
    ]


def _imports(node: ast.AST, module: str) -> bool:
    if isinstance(node, ast.ImportFrom) and node.module:
        named = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    elif isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    else:
        return False
    return any(n == module or n.startswith(module + ".") for n in named)


def _names(node: ast.AST, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute) and node.attr == name
    )


def _keyword(node: ast.AST, name: str) -> bool:
    if isinstance(node, ast.keyword):
        return node.arg == name
    return isinstance(node, ast.Dict) and any(
        isinstance(k, ast.Constant) and k.value == name for k in node.keys
    )


def test_the_sources_are_found() -> None:
    """The scans below read real modules (a wrong root would make them pass on nothing)."""
    assert len(TREES) > 100
    assert REPO / "workloads" / "slices" / "reservation.py" in SOURCES


@pytest.mark.parametrize("module", IMPORTED, ids=IMPORTED)
def test_only_the_compat_module_imports(module: str) -> None:
    assert _found(lambda node: _imports(node, module)) == [], (
        f"import {module} only in workloads/ray_compat.py"
    )


@pytest.mark.parametrize("name", NAMES, ids=NAMES)
def test_only_the_compat_module_names(name: str) -> None:
    assert _found(lambda node: _names(node, name)) == [], f"{name}: through workloads.ray_compat"


@pytest.mark.parametrize("keyword", KEYWORDS, ids=KEYWORDS)
def test_only_the_compat_module_passes(keyword: str) -> None:
    assert _found(lambda node: _keyword(node, keyword)) == [], (
        f"{keyword}=...: through workloads.ray_compat"
    )


@pytest.mark.parametrize(
    ("source", "check"),
    [
        ("from ray.util.tpu import slice_placement_group", lambda n: _imports(n, "ray.util.tpu")),
        ("import ray._private.state", lambda n: _imports(n, "ray._private")),
        (
            "from ray.util import placement_group_table",
            lambda n: _imports(n, "ray.util.placement_group_table"),
        ),
        ("pg(bundle_label_selector=[])", lambda n: _keyword(n, "bundle_label_selector")),
        ("o = {'label_selector': {}}", lambda n: _keyword(n, "label_selector")),
        ("ray._raylet.GcsClient()", lambda n: _names(n, "_raylet")),
    ],
    ids=["from-import", "import", "imported-name", "keyword", "dict-key", "attribute"],
)
def test_each_check_catches_its_form(source: str, check) -> None:
    """The scans can fail: each form of use is seen in a line of code."""
    assert any(check(node) for node in ast.walk(ast.parse(source)))


def test_the_floor_is_no_older_than_any_path_needs() -> None:
    floor = ray_versions.parse_version(ray_versions.MINIMUM_RAY_VERSION)
    needs = {p.name: ray_versions.parse_version(p.since) for p in ray_compat.PATHS}
    too_new = {name: since for name, since in needs.items() if since is None or since > floor}
    # max_preemption_failures (2.58) is optional: left out on older releases.
    assert set(too_new) <= {"ray.train.FailureConfig(max_preemption_failures=...)"}, too_new


def test_the_tested_versions_are_the_policys_range() -> None:
    tested = [ray_versions.parse_version(v) for v in ray_versions.TESTED_RAY_VERSIONS]
    assert all(tested) and tested == sorted(tested)
    assert ray_versions.TESTED_RAY_VERSIONS[0] == ray_versions.MINIMUM_RAY_VERSION
    assert ray_versions.TESTED_RAY_VERSIONS[-1] == ray_versions.PINNED_RAY_VERSION


def test_the_installed_ray_is_the_pinned_one() -> None:
    import ray

    assert ray.__version__ == ray_versions.PINNED_RAY_VERSION
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f"ray[data,default,serve,train]=={ray_versions.PINNED_RAY_VERSION}" in pyproject


def test_no_retries_on_this_ray_covers_preemptions() -> None:
    config = ray_compat.no_retries_failure_config()  # the installed Ray (2.60)
    assert (config.max_failures, config.max_preemption_failures) == (0, 0)


def test_no_retries_before_ray_2_58_leaves_the_preemption_limit_out(monkeypatch) -> None:
    import ray.train

    class FailureConfig:  # Ray 2.55 to 2.57's signature
        def __init__(self, max_failures: int, controller_failure_limit: int) -> None:
            self.kwargs = {"max_failures": max_failures, "controller": controller_failure_limit}

    monkeypatch.setattr(ray.train, "FailureConfig", FailureConfig)
    assert ray_compat.no_retries_failure_config().kwargs == {"max_failures": 0, "controller": 0}
