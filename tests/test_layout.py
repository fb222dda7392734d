"""The house rules: layers, no import cycles, small modules, each shape fact defined once.

Layers, bottom to top: ``raytpu`` (the core) <- ``infra``, ``policies``, ``workloads`` <-
``raytpu_cli``. The worker image ships only the core, ``workloads`` and ``raytpu_cli``: it has no
Pulumi and no ``infra``/``policies``, so what runs there must not import them.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("raytpu", "raytpu_cli", "infra", "policies", "workloads")
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    """Every project module outside tests/ and bench/: dotted name -> file."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    found["__main__"] = REPO / "__main__.py"
    return found


MODULES = _modules()
# Every module parsed once, here, while pytest collects: CPython 3.11 keeps ast.parse's recursion
# depth in state shared by all threads, so a parse during a test, beside another thread's parse,
# can raise "AST constructor recursion depth mismatch" (cpython#106905; CI hit it).
TREES: dict[Path, ast.Module] = {
    path: ast.parse(path.read_text(), filename=str(path)) for path in MODULES.values()
}


def _tree(path: Path) -> ast.Module:
    """A project module's tree from TREES; another file (a rule's own example) parsed now."""
    return TREES[path] if path in TREES else ast.parse(path.read_text(), filename=str(path))


def _imports(path: Path, *, top_level_only: bool = False) -> Iterator[str]:
    """Absolute names imported by a module (``from a import b`` yields ``a`` and ``a.b``)."""
    tree = _tree(path)
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _project_edges(name: str, *, top_level_only: bool = False) -> set[str]:
    """The project modules ``name`` imports (anywhere in it, or only at module level)."""
    edges = set()
    for imported in _imports(MODULES[name], top_level_only=top_level_only):
        if imported in MODULES and imported != name:
            edges.add(imported)
    return edges


def _package(module: str) -> str:
    return module.split(".")[0]


@pytest.mark.parametrize("name", sorted(MODULES), ids=sorted(MODULES))
def test_module_is_at_most_500_lines(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[name].relative_to(REPO)}: {lines} lines > {MAX_LINES}"


def test_no_import_cycle() -> None:
    graph = {name: _project_edges(name) for name in MODULES}
    # A package __init__ is imported by its submodules implicitly; only explicit edges count.
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == 1:
                cycle = [*stack[stack.index(child) :], child]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if child not in state:
                visit(child)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


ALLOWED_PACKAGES = {
    "raytpu": {"raytpu"},
    "infra": {"raytpu", "infra"},
    "policies": {"raytpu", "policies"},
    "workloads": {"raytpu", "workloads"},
    "raytpu_cli": set(PACKAGES),
    "__main__": {"infra"},
}


@pytest.mark.parametrize("name", sorted(MODULES), ids=sorted(MODULES))
def test_imports_only_lower_layers(name: str) -> None:
    allowed = ALLOWED_PACKAGES[_package(name)]
    wrong = sorted(m for m in _project_edges(name) if _package(m) not in allowed)
    assert not wrong, f"{name} imports {wrong}; {_package(name)} may import only {sorted(allowed)}"


@pytest.mark.parametrize(
    "name", sorted(m for m in MODULES if _package(m) == "raytpu"), ids=lambda n: n
)
def test_core_imports_no_framework_at_module_level(name: str) -> None:
    forbidden = ("pulumi", "pulumi_gcp", "pulumi_kubernetes", "pulumi_policy", "ray", "jax")
    wrong = sorted(
        i for i in _imports(MODULES[name], top_level_only=True) if i.split(".")[0] in forbidden
    )
    assert not wrong, f"{name} imports {wrong} at module level"


BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys
    BLOCKED = {"infra", "policies", "pulumi", "pulumi_gcp", "pulumi_kubernetes", "pulumi_policy"}

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not in the worker image")
            return None

    sys.meta_path.insert(0, Blocker())
    """
)


@pytest.mark.parametrize(
    "code",
    [
        "import raytpu.catalog, raytpu.ray_names, raytpu.ray_versions, raytpu.entrypoints, "
        "raytpu.stack_outputs",
        "import workloads.training.driver, workloads.model.byte_lm, workloads.model.checkpoint, workloads.slices.reservation, "
        "workloads.sim.local_cluster",
        "import workloads.serving.app",
        "from raytpu_cli.main import main; sys.exit(main(['catalog', 'v6e', '4x4']))",
    ],
    ids=["core", "training", "serving", "raytpu-catalog-on-a-worker"],
)
def test_worker_image_imports_without_infra_policies_or_pulumi(code: str) -> None:
    """What the worker image runs imports with infra, policies and Pulumi made unimportable."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + "\n" + code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_blocker_really_blocks() -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKER + "\nimport infra.config"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "not in the worker image" in result.stderr


@functools.cache
def _constants(path: Path) -> tuple[object, ...]:
    """Every constant a module spells."""
    return tuple(n.value for n in ast.walk(_tree(path)) if isinstance(n, ast.Constant))


# Each shape fact or Ray name, and the one module that may spell it.
SHAPE_FACTS = [
    ("HIGH_THROUGHPUT", lambda v: isinstance(v, str) and "HIGH_THROUGHPUT" in v, "raytpu.catalog"),
    ("tpu7x by name", lambda v: v == "tpu7x", "raytpu.generations"),
    (
        "ray.io/tpu-* labels",
        lambda v: isinstance(v, str) and "ray.io/tpu-" in v,
        "raytpu.ray_names",
    ),
    (
        "ray.io/accelerator-type",
        lambda v: isinstance(v, str) and "ray.io/accelerator-type" in v,
        "raytpu.ray_names",
    ),
    ("GCS port 6379", lambda v: v == 6379, "raytpu.ray_names"),
    ("dashboard port 8265", lambda v: v == 8265, "raytpu.ray_names"),
    ("client port 10001", lambda v: v == 10001, "raytpu.ray_names"),
]


@pytest.mark.parametrize(
    ("fact", "matches", "home"), SHAPE_FACTS, ids=[fact for fact, _, _ in SHAPE_FACTS]
)
def test_shape_fact_is_defined_once(fact: str, matches, home: str) -> None:
    """Docstrings may mention a fact; code constants spell it only in its home module."""
    spelled = sorted(
        name
        for name, path in MODULES.items()
        if name != home
        and any(
            matches(value)
            for value in _constants(path)
            if not (isinstance(value, str) and "\n" in value)  # docstrings and help texts
        )
    )
    assert not spelled, f"{fact} is spelled in {spelled}; import it from {home}"


def _arithmetic_on_shapes(path: Path) -> Iterator[str]:
    """Shape arithmetic the catalog owns: ``x.chips // n`` and ``chips_per_host=<literal>``."""
    for node in ast.walk(_tree(path)):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.FloorDiv)
            and isinstance(node.left, ast.Attribute)
            and node.left.attr in ("chips", "tensorcores")
        ):
            yield f"line {node.lineno}: .{node.left.attr} // ..."
        if (
            isinstance(node, ast.keyword)
            and node.arg == "chips_per_host"
            and isinstance(node.value, ast.Constant)
        ):
            yield f"line {node.lineno}: chips_per_host={node.value.value!r}"


@pytest.mark.parametrize(
    "name", sorted(m for m in MODULES if m != "raytpu.catalog"), ids=lambda n: n
)
def test_shape_arithmetic_lives_in_the_catalog(name: str) -> None:
    found = list(_arithmetic_on_shapes(MODULES[name]))
    assert not found, f"{name}: {found}; use SliceShape.hosts / SliceShape.workers() / the catalog"


# --- Rooms: where a newcomer finds each concern, and the walls between them -------------------

ROOMS = {
    "workloads.slices": "reserving whole TPU slices and releasing them",
    "workloads.sim": "the local cluster that simulates TPU hosts (used by tests and the CLI only)",
    "workloads.model": "model families, sharding, checkpoints",
    "workloads.data": "the corpus and text data",
    "workloads.training": "the driver, the worker loop, goodput and recovery",
    "workloads.serving": "the Serve app, routes, requests, fallback",
    "workloads.serving.engine": "batched decode with the prefix-reusing KV cache",
    "workloads.batch": "batch inference with Ray Data on reserved slices, outputs written once",
    "infra.components": "every Pulumi ComponentResource, one per file",
    "infra.manifests": "pure builders of Kubernetes objects (no Pulumi)",
    "infra.config": "the stack file, read once into frozen dataclasses",
}
# Modules allowed beside the rooms, at the top of their wing.
TOP_MODULES = {
    "workloads": {
        "workloads",
        "workloads.telemetry",
        "workloads.storage",
        "workloads.serve",
        "workloads.ray_compat",
    },
    "infra": {"infra", "infra.program", "infra.offline", "infra.worker_image"},
}
# (room, the modules that may not import it, why)
WALLS = [
    (
        "workloads.sim",
        "workloads.",
        "the simulation is the test bench; workloads run the same on GKE without it",
    ),
    ("workloads.training", "workloads.serving", "serving loads checkpoints, not the training loop"),
    ("pulumi", "infra.manifests", "manifests are pure data; components turn them into resources"),
]
# The one module that only re-exports: the import path stack files, the Dockerfile and docs name.
ALLOWED_SHIMS = {"workloads.serve"}
MAX_FUNCTION_LINES = 120


def _room(module: str) -> str | None:
    """The deepest room that holds ``module`` (``None`` for top-level modules)."""
    rooms = [r for r in ROOMS if module == r or module.startswith(r + ".")]
    return max(rooms, key=len) if rooms else None


@pytest.mark.parametrize("room", sorted(ROOMS), ids=sorted(ROOMS))
def test_room_exists_as_a_package(room: str) -> None:
    assert room in MODULES, f"{room} ({ROOMS[room]}) is missing: expected {room.replace('.', '/')}/"
    assert MODULES[room].name == "__init__.py"
    assert MODULES[room].read_text().strip(), (
        f"{room}/__init__.py needs a docstring saying what lives there"
    )


@pytest.mark.parametrize("wing", sorted(TOP_MODULES), ids=sorted(TOP_MODULES))
def test_every_module_of_a_wing_is_in_a_room(wing: str) -> None:
    loose = sorted(
        m
        for m in MODULES
        if _package(m) == wing and _room(m) is None and m not in TOP_MODULES[wing]
    )
    assert not loose, f"{loose} sit loose in {wing}/; move each into one of {sorted(ROOMS)}"


@pytest.mark.parametrize(
    ("room", "importers", "why"), WALLS, ids=[f"{r}-not-in-{i.rstrip('.')}" for r, i, _ in WALLS]
)
def test_walls_between_rooms(room: str, importers: str, why: str) -> None:
    wrong = sorted(
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if (name == importers or name.startswith(importers)) and _room(name) != room
        for imported in _imports(path)
        if imported == room or imported.startswith(room + ".")
    )
    assert not wrong, f"{wrong}: {why}"


def _is_component(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(b, ast.Attribute) and b.attr == "ComponentResource")
        or (isinstance(b, ast.Name) and b.id == "ComponentResource")
        for b in node.bases
    )


def test_every_component_lives_alone_in_infra_components() -> None:
    found: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and _is_component(node):
                found.setdefault(name, []).append(node.name)
    misplaced = sorted(n for n in found if _room(n) != "infra.components")
    crowded = sorted(f"{n}: {c}" for n, c in found.items() if len(c) > 1)
    assert found, "no ComponentResource found: the rule would pass vacuously"
    assert not misplaced, f"ComponentResources outside infra/components/: {misplaced}"
    assert not crowded, f"one ComponentResource per file: {crowded}"


def _body_without_docstring(tree: ast.Module) -> list[ast.stmt]:
    return [
        n
        for n in tree.body
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
        and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
    ]


def _reexports(path: Path) -> list[str]:
    """Names a module lists in ``__all__`` but imports from another project module."""
    tree = _tree(path)
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and _package(node.module) in PACKAGES
        for alias in node.names
    }
    exported = [
        element.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        for element in node.value.elts
        if isinstance(element, ast.Constant)
    ]
    return [name for name in exported if name in imported]


def _is_shim(path: Path) -> bool:
    """A module whose body is only imports (and ``__all__``)."""
    body = _body_without_docstring(_tree(path))
    imports = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
    rest = [
        n
        for n in body
        if n not in imports
        and not (
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
        )
    ]
    return bool(imports) and not rest


@pytest.mark.parametrize("name", sorted(MODULES), ids=sorted(MODULES))
def test_no_shim_and_no_reexport(name: str) -> None:
    if name in ALLOWED_SHIMS:
        assert _is_shim(MODULES[name]) and len(MODULES[name].read_text().splitlines()) <= 3
        return
    assert not _is_shim(MODULES[name]), f"{name} only re-exports; import from the defining modules"
    again = _reexports(MODULES[name])
    assert not again, f"{name} re-exports {again} in __all__; callers import them where they live"


def _long_functions() -> dict[str, int]:
    found = {}
    for name, path in MODULES.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    found[f"{name}.{node.name}"] = lines
    return found


def test_no_function_over_120_lines() -> None:
    found = _long_functions()
    assert not found, (
        f"functions over {MAX_FUNCTION_LINES} lines: {found}; split them into named steps"
    )


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("import os\n__all__ = ['os']\n", "shim"),
        ('"""Doc."""\nfrom raytpu.catalog import SHAPES\n', "shim"),
        (
            "from raytpu.catalog import SHAPES\n\n\ndef f():\n    return SHAPES\n\n__all__ = ['SHAPES']\n",
            "reexport",
        ),
        ("def f():\n" + "    x = 1\n" * MAX_FUNCTION_LINES + "    return x\n", "long"),
    ],
    ids=["imports-only", "docstring-and-import", "all-lists-an-import", "long-function"],
)
def test_the_rules_catch_what_they_name(
    tmp_path: Path, source: str, rule: str, monkeypatch
) -> None:
    path = tmp_path / "bad.py"
    path.write_text(source)
    caught = {
        "shim": _is_shim(path),
        "reexport": bool(_reexports(path)),
        "long": False,
    }
    if rule == "long":
        monkeypatch.setitem(MODULES, "bad", path)
        caught["long"] = "bad.f" in _long_functions()
    assert caught[rule], f"{rule} rule missed {source[:60]!r}"


# --- Refusals: one message shape, built by raytpu.errors.invalid ------------------------------

REFUSAL_TEXT = "is not" + " valid"  # split, so that this file does not spell it
REFUSAL_HOME = "raytpu/errors.py"
# Files that may still spell a refusal by hand: {"path": "why"}.
ALLOWED_HAND_REFUSALS: dict[str, str] = {}


def _hand_refusals(text: str) -> list[int]:
    """The lines of ``text`` that spell a refusal by hand instead of calling ``invalid()``."""
    return [n for n, line in enumerate(text.splitlines(), 1) if REFUSAL_TEXT in line]


def test_refusals_use_invalid() -> None:
    found = [
        f"{relative}:{line}"
        for path in MODULES.values()
        if (relative := path.relative_to(REPO).as_posix()).split("/")[0] in PACKAGES
        and relative != REFUSAL_HOME
        and relative not in ALLOWED_HAND_REFUSALS
        for line in _hand_refusals(path.read_text())
    ]
    assert not found, f"refusals spelled by hand: {found}; build them with raytpu.errors.invalid"
    stale = sorted(p for p in ALLOWED_HAND_REFUSALS if not (REPO / p).is_file())
    assert not stale, f"ALLOWED_HAND_REFUSALS names missing files: {stale}"


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ('raise ValueError(f"n: {n!r} ' + REFUSAL_TEXT + '; valid: >= 1")\n', [1]),
        ('x = 1\nmsg = "port ' + REFUSAL_TEXT + ' (in use)"\n', [2]),
        ('raise ValueError(invalid("n", n, ">= 1"))\n', []),
    ],
    ids=["by-hand", "with-a-reason", "through-invalid"],
)
def test_the_refusal_guard_catches_what_it_names(source: str, lines: list[int]) -> None:
    assert _hand_refusals(source) == lines
