"""Every declared object checked against its real schema: the CRD sets (fetched at their pins)
and Kubernetes' own OpenAPI schemas for core objects; and the CRD fetch itself."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.stack import load_stack_file
from infra.offline import DeclaredResource, run_program, run_stack
from raytpu import crd_pins, crds, gmp_crds, k8s_schemas, kueue
from raytpu_cli import crds as crds_command
from raytpu_cli import schema_check
from raytpu_cli.main import main

REPO = Path(__file__).resolve().parents[1]
TEAMS_STACK = REPO / "tests" / "data" / "Pulumi.teams.yaml"
IAP_STACK = REPO / "tests" / "data" / "Pulumi.iap.yaml"
CI = REPO / ".github" / "workflows" / "ci.yml"


@functools.cache
def _declared(stack: str) -> tuple[DeclaredResource, ...]:
    if stack in ("teams", "iap"):
        path = TEAMS_STACK if stack == "teams" else IAP_STACK
        return tuple(run_program(load_stack_file(path), stack=stack)[0])
    return tuple(run_stack(stack)[0])


def _objects(stack: str, matches: Callable[[str], bool]) -> list[DeclaredResource]:
    return [r for r in _declared(stack) if matches(r.type)]


@pytest.fixture(scope="module")
def crds_present() -> None:
    missing = {s.pin.name: s.missing() for s in crds_command.SETS if s.missing()}
    if missing:
        pytest.skip(f"CRDs absent, schema checks NOT run: {missing}")


RBAC = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "Secret"}


@pytest.mark.parametrize(
    ("stack", "core_kinds"),
    [
        ("dev", RBAC),
        ("prod", RBAC),
        ("teams", RBAC - {"Secret"}),
        ("iap", RBAC | {"Deployment", "Service", "Ingress", "ConfigMap"}),
    ],
    ids=["dev", "prod", "teams", "iap"],
)
def test_every_declared_object_passes_its_schema(
    stack: str, core_kinds: set[str], crds_present: None
) -> None:
    report = schema_check.check(_declared(stack))
    assert report.skipped == ()
    assert [v.message for v in report.violations] == []
    core = _objects(stack, k8s_schemas.is_core)
    assert core_kinds <= {r.type.rsplit(":", 1)[-1] for r in core}


def _mutated(resource: DeclaredResource, change: Callable[[dict[str, Any]], object]):
    props = yaml.safe_load(yaml.safe_dump(resource.props))  # a deep, plain copy
    change(props)
    return dataclasses.replace(resource, props=props)


def _first(stack: str, kind: str) -> DeclaredResource:
    return next(
        r
        for r in _declared(stack)
        if r.custom and r.type.startswith("kubernetes:") and r.type.endswith(f":{kind}")
    )


MUTATIONS = {
    "raycluster-misspelled-field": (
        "RayCluster",
        lambda p: p["spec"]["headGroupSpec"].update(rayStartParms={"num-cpus": "0"}),
        "kuberay-crd-schema",
        "spec.headGroupSpec.rayStartParms: unknown field",
    ),
    "raycluster-wrong-type": (
        "RayCluster",
        lambda p: p["spec"]["workerGroupSpecs"][0].update(numOfHosts="four"),
        "kuberay-crd-schema",
        "spec.workerGroupSpecs.0.numOfHosts",
    ),
    "podmonitoring-unknown-field": (
        "PodMonitoring",
        lambda p: p["spec"].update(scrapeEvery="30s"),
        "gmp-crd-schema",
        "spec.scrapeEvery: unknown field",
    ),
    "namespace-unknown-field": (
        "Namespace",
        lambda p: p["metadata"].update(lables={"a": "b"}),
        "kubernetes-schema",
        "metadata: Additional properties are not allowed ('lables' was unexpected)",
    ),
    "networkpolicy-wrong-type": (
        "NetworkPolicy",
        lambda p: p["spec"].update(policyTypes="Ingress"),
        "kubernetes-schema",
        "spec.policyTypes: 'Ingress' is not of type 'array'",
    ),
    "rolebinding-missing-roleref": (
        "RoleBinding",
        lambda p: p.pop("roleRef"),
        "kubernetes-schema",
        "'roleRef' is a required property",
    ),
}


@pytest.mark.parametrize(
    ("kind", "change", "policy", "message"), MUTATIONS.values(), ids=MUTATIONS.keys()
)
def test_a_mutated_object_fails_with_its_field_path(
    kind: str, change, policy: str, message: str, crds_present: None
) -> None:
    bad = _mutated(_first("dev", kind), change)
    violations = schema_check.check([bad]).violations
    assert [(v.policy, v.mandatory) for v in violations] == [(policy, True)]
    assert message in violations[0].message


def test_kueue_objects_of_the_teams_stack_are_checked(crds_present: None) -> None:
    queue = _first("teams", "ClusterQueue")
    bad = _mutated(queue, lambda p: p["spec"].update(cohort="tpu"))
    messages = [v.message for v in schema_check.check([bad]).violations]
    assert messages == ["spec.cohort: unknown field (the API server would drop it)"]


@pytest.fixture
def no_crds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for crd_set in crds_command.SETS:
        monkeypatch.setenv(crd_set.env_var, str(tmp_path / "none" / crd_set.pin.name))


def test_missing_crd_sets_are_skipped_and_named_in_one_line(no_crds: None) -> None:
    report = schema_check.check(_declared("teams"))
    assert {s.pin.name for s in report.skipped} == {"kuberay", "kueue", "gmp"}
    line = report.skipped_line()
    assert line is not None and "\n" not in line
    for name in ("KubeRay", "Kueue", "GKE managed Prometheus", "raytpu crds fetch"):
        assert name in line
    assert [v.policy for v in report.violations] == []  # core objects are still checked
    bad = _mutated(_first("teams", "Namespace"), lambda p: p.update(spec={"x": 1}))
    assert [v.policy for v in schema_check.check([bad]).violations] == ["kubernetes-schema"]


@pytest.mark.parametrize(
    ("channel", "min_master", "minor"),
    [("REGULAR", "", "1.35"), ("RAPID", "", "1.36"), ("STABLE", "1.34.1-gke.3084001", "1.34")],
    ids=["regular", "rapid", "pinned-master"],
)
def test_kubernetes_minor_follows_the_release_channel(channel, min_master, minor) -> None:
    assert k8s_schemas.kubernetes_minor(channel, min_master) == minor


@pytest.mark.parametrize(
    ("minor", "message"),
    [("latest", "'latest' is not valid"), ("1.99", "upgrade kubernetes-validate")],
    ids=["not-a-minor", "too-new"],
)
def test_bad_kubernetes_version_is_refused(minor: str, message: str, capsys) -> None:
    assert main(["check", str(TEAMS_STACK), "--kubernetes-version", minor]) == 2
    assert message in capsys.readouterr().err


# --- The pins and the fetch ----------------------------------------------------------------


def test_each_set_has_one_pin_and_ci_fetches_at_it() -> None:
    assert [s.pin for s in crds_command.SETS] == list(crd_pins.PINS)
    assert crd_pins.pin("kueue").ref == f"v{kueue.KUEUE_VERSION}"
    workflow = CI.read_text()
    assert "raytpu crds fetch" in workflow
    assert f"KUBERAY_REF: {crd_pins.pin('kuberay').ref}" in workflow
    for row in crd_pins.PINS:
        assert len(row.ref) == 40 or row.ref.startswith("v"), f"{row.name}: pin a tag or a SHA"


def _mirror(root: Path) -> Path:
    """The pinned files laid out as the raw host serves them, from the development copies."""
    for crd_set in crds_command.SETS:
        folder = root / crd_set.pin.repository / crd_set.pin.ref / crd_set.pin.path
        folder.mkdir(parents=True)
        for filename in crd_set.filenames():
            shutil.copy(crd_set.crds_dir() / filename, folder / filename)
    return root


@pytest.fixture
def raw_host(tmp_path: Path, crds_present: None) -> Iterator[str]:
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(_mirror(tmp_path / "raw"))
    )
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_fetch_puts_every_set_where_the_checks_read_it(
    raw_host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    into = tmp_path / "fetched"
    assert main(["crds", "fetch", "--into", str(into), "--base-url", raw_host]) == 0
    out = capsys.readouterr().out
    for crd_set in crds_command.SETS:
        assert sorted(p.name for p in (into / crd_set.pin.name).iterdir()) == sorted(
            crd_set.filenames()
        )
        assert f"export {crd_set.env_var}={into / crd_set.pin.name}" in out
        monkeypatch.setenv(crd_set.env_var, str(into / crd_set.pin.name))
    assert crds.KUBERAY.validate_spec("RayCluster", {"headGroupSpec": 1}) != []
    assert gmp_crds.GMP.missing() == [] and kueue.KUEUE.missing() == []


@pytest.mark.parametrize(
    ("base", "message"),
    [("/missing", "404"), ("/not-a-crd", "not a CustomResourceDefinition")],
    ids=["404", "wrong-file"],
)
def test_a_failed_fetch_keeps_what_was_there(
    raw_host: str, tmp_path: Path, base: str, message: str, capsys
) -> None:
    root = Path(
        raw_host and (tmp_path / "raw")  # the mirror the server serves
    )
    if base == "/not-a-crd":
        pin = crd_pins.pin("kuberay")
        target = root / base.strip("/") / pin.repository / pin.ref / pin.path
        target.mkdir(parents=True)
        for filename in crds.KUBERAY.filenames():
            (target / filename).write_text("kind: ConfigMap\n")
    into = tmp_path / "fetched"
    (into / "kuberay").mkdir(parents=True)
    (into / "kuberay" / "keep.txt").write_text("before")
    code = main(
        ["crds", "fetch", "--set", "kuberay", "--into", str(into), "--base-url", raw_host + base]
    )
    assert code == 2
    assert message in capsys.readouterr().err
    assert [p.name for p in (into / "kuberay").iterdir()] == ["keep.txt"]
    assert [p.name for p in into.iterdir()] == ["kuberay"]  # no staging folder left behind
