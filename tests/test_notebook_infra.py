"""``ray-tpu:notebooks`` under Pulumi mocks: the objects a team's JupyterLab is made of, each
against Kubernetes' own schema; its RBAC asked rule by rule (what it may and may not do) the way
the API server's RBAC authorizer answers; and the ``notebook-token-auth`` policy on the declared
objects and on exposed or unauthenticated ones."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.config.stack import parse_config
from infra.offline import DeclaredResource, ProgramRun, run_program_detailed
from policies.evaluation import evaluate
from raytpu import k8s_schemas
from raytpu_cli import schema_check

REPO = Path(__file__).resolve().parents[1]
RBAC = "kubernetes:rbac.authorization.k8s.io/v1"
ROLE, BINDING = f"{RBAC}:Role", f"{RBAC}:RoleBinding"
DEPLOYMENT, SERVICE = "kubernetes:apps/v1:Deployment", "kubernetes:core/v1:Service"
COMPONENT = "ray-tpu:infra:Notebook"


def _raw(stack_file: Path) -> dict[str, Any]:
    raw = yaml.safe_load(stack_file.read_text(encoding="utf-8"))["config"]
    raw["ray-tpu:notebooks"] = {}
    return raw


@pytest.fixture(scope="module")
def teams() -> ProgramRun:
    """The teams stack with notebooks: research is the one team with a RayCluster."""
    raw = _raw(REPO / "tests" / "data" / "Pulumi.teams.yaml")
    return run_program_detailed(parse_config(raw), stack="teams")


@pytest.fixture(scope="module")
def dev() -> ProgramRun:
    """The dev stack with its one notebook, on its RayCluster ``train``."""
    return run_program_detailed(parse_config(_raw(REPO / "Pulumi.dev.yaml")), stack="dev")


def _children(run: ProgramRun, component: str) -> list[DeclaredResource]:
    (parent,) = [r for r in run.resources if r.type == COMPONENT and r.name == component]
    return [r for r in run.resources if r.parent == parent.urn]


def _kinds(resources: Iterable[DeclaredResource]) -> list[str]:
    return sorted(r.type.rsplit(":", 1)[-1] for r in resources)


def _container(run: ProgramRun, component: str) -> dict[str, Any]:
    (deployment,) = [r for r in _children(run, component) if r.type == DEPLOYMENT]
    (container,) = deployment.props["spec"]["template"]["spec"]["containers"]
    return container


# ----------------------------------------------------------------------------- the objects
NOTEBOOK_KINDS = sorted(
    [
        "ServiceAccount", "Role", "RoleBinding", "RoleBinding", "Secret", "Deployment",
        "Service", "NetworkPolicy", "NetworkPolicy", "RandomPassword",
    ]
)  # fmt: skip


@pytest.mark.parametrize(
    ("run", "component", "namespace", "cluster"),
    [
        ("teams", "notebook-research-notebook", "research", "research-dev"),
        ("dev", "notebook-notebook", "ray", "train"),
    ],
    ids=["team", "stack"],
)
def test_the_notebook_is_its_objects_and_attaches_to_its_cluster(
    request, run: str, component: str, namespace: str, cluster: str
) -> None:
    program: ProgramRun = request.getfixturevalue(run)
    children = _children(program, component)
    assert _kinds(children) == NOTEBOOK_KINDS
    assert {r.props["metadata"]["namespace"] for r in children if "metadata" in r.props} == {
        namespace
    }
    env = {e["name"]: e for e in _container(program, component)["env"]}
    assert env["RAY_ADDRESS"]["value"] == (
        f"ray://{cluster}-head-svc.{namespace}.svc.cluster.local:10001"
    )
    # A RayCluster authenticates with Kubernetes tokens: the notebook's own is its credential.
    assert env["RAY_AUTH_MODE"]["value"] == "token"
    assert env["RAY_AUTH_TOKEN_PATH"]["value"].endswith("/serviceaccount/token")
    assert "RAY_AUTH_TOKEN" not in env
    name = component.removeprefix("notebook-")
    token = env["JUPYTER_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": f"{name}-jupyter-token", "key": "token"}
    (service,) = [r for r in children if r.type == SERVICE]
    assert service.props["spec"]["type"] == "ClusterIP"
    assert program.outputs["notebooks"][name]["rayCluster"] == cluster


def test_only_teams_with_a_ray_cluster_get_a_notebook(teams: ProgramRun) -> None:
    components = sorted(r.name for r in teams.resources if r.type == COMPONENT)
    assert components == ["notebook-research-notebook"]
    assert teams.outputs["notebooks"]["research-notebook"]["team"] == "research"


def test_the_jupyter_token_is_generated_and_never_an_output(teams: ProgramRun) -> None:
    children = _children(teams, "notebook-research-notebook")
    (password,) = [r for r in children if r.type.startswith("random:")]
    assert password.props["length"] == 48 and password.props["special"] is False
    (secret,) = [r for r in children if r.type == "kubernetes:core/v1:Secret"]
    data = secret.props["stringData"]
    assert set(data.get("value", data)) == {"token"}  # the engine marks the data secret
    assert "token" not in teams.outputs["notebooks"]["research-notebook"]


@pytest.mark.parametrize("run", ["teams", "dev"])
def test_every_notebook_object_passes_the_kubernetes_schema(request, run: str) -> None:
    program: ProgramRun = request.getfixturevalue(run)
    core = [r for r in program.resources if "notebook" in r.name and k8s_schemas.is_core(r.type)]
    assert _kinds(core) == [k for k in NOTEBOOK_KINDS if k != "RandomPassword"]
    report = schema_check.check(core)
    assert [v.message for v in report.violations] == []
    broken = copy.deepcopy(next(r for r in core if r.type == DEPLOYMENT))
    broken.props["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    messages = [v.message for v in schema_check.check([broken]).violations]
    assert any("containerPort" in m for m in messages), messages  # the check can fail


# ------------------------------------------------------------------------- RBAC, rule by rule
@dataclasses.dataclass(frozen=True)
class Ask:
    """One request the API server's RBAC authorizer decides."""

    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str = ""


def _matches(values: list[str], wanted: str) -> bool:
    return "*" in values or wanted in values


def _granted(rule: dict[str, Any], ask: Ask) -> bool:
    """Kubernetes RBAC: a rule grants when its apiGroups, resources and verbs each hold the
    request's (or ``*``), and its resourceNames are empty or name the object."""
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("apiGroups", []), ask.group)
        and _matches(rule.get("resources", []), ask.resource)
        and _matches(rule.get("verbs", []), ask.verb)
        and (not names or ask.name in names)
    )


def _allowed(run: ProgramRun, account: str, namespace: str, ask: Ask) -> bool:
    """Whether the ServiceAccount may: a Role grants only in its own namespace, through a
    RoleBinding there naming the account; any ClusterRoleBinding naming it fails the test."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    cluster_bindings = [
        r for r in run.resources if r.type.endswith(":ClusterRoleBinding")
        and subject in r.props.get("subjects", [])
    ]  # fmt: skip
    assert cluster_bindings == []
    roles = {
        (r.props["metadata"]["namespace"], r.props["metadata"]["name"]): r.props["rules"]
        for r in run.of_type(ROLE)
    }
    for binding in run.of_type(BINDING):
        where = binding.props["metadata"]["namespace"]
        if subject not in binding.props["subjects"] or where != ask.namespace:
            continue
        rules = roles[(where, binding.props["roleRef"]["name"])]
        if any(_granted(rule, ask) for rule in rules):
            return True
    return False


ASKS = {
    # may: use the team's RayCluster and queue
    "get-its-raycluster": (Ask("get", "ray.io", "rayclusters", "research", "research-dev"), True),
    "ray-write-its-raycluster": (
        Ask("ray:write", "ray.io", "rayclusters", "research", "research-dev"),
        True,
    ),
    "create-a-rayjob": (Ask("create", "ray.io", "rayjobs", "research"), True),
    "delete-a-rayjob": (Ask("delete", "ray.io", "rayjobs", "research", "mine"), True),
    "get-its-localqueue": (
        Ask("get", "kueue.x-k8s.io", "localqueues", "research", "research"),
        True,
    ),
    "read-pod-logs": (Ask("get", "", "pods/log", "research", "research-dev-head"), True),
    # may not: change the cluster, the pools, the queues or anything of another team
    "patch-its-raycluster": (
        Ask("patch", "ray.io", "rayclusters", "research", "research-dev"),
        False,
    ),
    "delete-its-raycluster": (
        Ask("delete", "ray.io", "rayclusters", "research", "research-dev"),
        False,
    ),
    "create-a-raycluster": (Ask("create", "ray.io", "rayclusters", "research"), False),
    "create-a-rayservice": (Ask("create", "ray.io", "rayservices", "research"), False),
    "rayjob-in-another-namespace": (Ask("create", "ray.io", "rayjobs", "serving"), False),
    "ray-write-another-cluster": (
        Ask("ray:write", "ray.io", "rayclusters", "research", "other"),
        False,
    ),
    "another-teams-localqueue": (
        Ask("get", "kueue.x-k8s.io", "localqueues", "research", "batch"),
        False,
    ),
    "update-its-localqueue": (
        Ask("update", "kueue.x-k8s.io", "localqueues", "research", "research"),
        False,
    ),
    "patch-a-clusterqueue": (Ask("patch", "kueue.x-k8s.io", "clusterqueues", None), False),
    "patch-a-node": (Ask("patch", "", "nodes", None, "gke-tpu-node"), False),
    "create-a-pod": (Ask("create", "", "pods", "research"), False),
    "exec-into-a-pod": (Ask("create", "", "pods/exec", "research", "research-dev-head"), False),
    "read-a-secret": (Ask("get", "", "secrets", "research", "research-dev-ray-auth"), False),
    "create-a-rolebinding": (
        Ask("create", "rbac.authorization.k8s.io", "rolebindings", "research"),
        False,
    ),
    "escalate-its-role": (
        Ask("escalate", "rbac.authorization.k8s.io", "roles", "research", "research-notebook"),
        False,
    ),
}


@pytest.mark.parametrize(("ask", "allowed"), ASKS.values(), ids=ASKS.keys())
def test_the_notebook_may_use_its_cluster_and_queue_and_nothing_more(
    teams: ProgramRun, ask: Ask, allowed: bool
) -> None:
    assert _allowed(teams, "research-notebook", "research", ask) is allowed


def test_every_rule_of_the_notebook_role_is_one_the_asks_cover(teams: ProgramRun) -> None:
    """A rule added to the Role without a may/may-not row here fails: each rule is granted by
    at least one allowed ask, and no rule holds a wildcard."""
    (role,) = [r for r in teams.of_type(ROLE) if r.props["metadata"]["name"] == "research-notebook"]
    granted = [ask for ask, allowed in ASKS.values() if allowed]
    for rule in role.props["rules"]:
        assert any(_granted(rule, ask) for ask in granted), rule
        assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule["verbs"]], rule


def test_no_google_identity_is_bound_to_the_notebook(teams: ProgramRun) -> None:
    """Node pools are GCP objects: without a Workload Identity binding the notebook's
    ServiceAccount has no Google credential to change them with."""
    account = "research/research-notebook"
    bound = [
        r.name for r in teams.resources if r.type.startswith("gcp:") and account in str(r.props)
    ]
    assert bound == []
    (sa,) = [
        r
        for r in _children(teams, "notebook-research-notebook")
        if r.type.endswith("ServiceAccount")
    ]
    assert "iam.gke.io/gcp-service-account" not in (sa.props["metadata"].get("annotations") or {})


# ------------------------------------------------------------------------------ the policy
def _notebook_violations(resources: Iterable[Any]) -> list[str]:
    return [v.message for v in evaluate(list(resources)) if v.policy == "notebook-token-auth"]


@pytest.mark.parametrize("run", ["teams", "dev"])
def test_the_declared_notebooks_pass_every_policy(request, run: str) -> None:
    program: ProgramRun = request.getfixturevalue(run)
    assert [(v.policy, v.message) for v in evaluate(program.resources)] == []


def _no_token(c: dict[str, Any]) -> None:
    c["env"] = [e for e in c["env"] if e["name"] != "JUPYTER_TOKEN"]


def _empty_token(c: dict[str, Any]) -> None:
    c["env"] = [
        {"name": "JUPYTER_TOKEN", "value": ""} if e["name"] == "JUPYTER_TOKEN" else e
        for e in c["env"]
    ]


# change to the declared container -> (what the message says, how it says to fix it)
UNAUTHENTICATED = {
    "no-token": (_no_token, "no token from a Secret", "secretKeyRef"),
    "empty-token": (_empty_token, "env JUPYTER_TOKEN: an empty value", "secretKeyRef"),
    "token-argument-empty": (
        lambda c: c["command"].append("--IdentityProvider.token="),
        "sets an empty Jupyter token",
        "secretKeyRef",
    ),
    "xsrf-off": (
        lambda c: c["command"].append("--ServerApp.disable_check_xsrf=True"),
        "turns Jupyter's XSRF check off",
        "remove it",
    ),
}


@pytest.mark.parametrize(
    ("change", "message", "fix"), UNAUTHENTICATED.values(), ids=UNAUTHENTICATED.keys()
)
def test_the_policy_refuses_the_declared_notebook_made_unauthenticated(
    teams: ProgramRun, change, message: str, fix: str
) -> None:
    (deployment,) = [
        r for r in _children(teams, "notebook-research-notebook") if r.type == DEPLOYMENT
    ]
    props = copy.deepcopy(deployment.props)
    change(props["spec"]["template"]["spec"]["containers"][0])
    found = _notebook_violations([dataclasses.replace(deployment, props=props)])
    assert len(found) == 1 and message in found[0] and fix in found[0], found


@pytest.mark.parametrize("kind", ["LoadBalancer", "NodePort"])
def test_the_policy_refuses_the_declared_service_exposed(teams: ProgramRun, kind: str) -> None:
    (service,) = [r for r in _children(teams, "notebook-research-notebook") if r.type == SERVICE]
    props = copy.deepcopy(service.props)
    props["spec"]["type"] = kind
    found = _notebook_violations([dataclasses.replace(service, props=props)])
    assert len(found) == 1 and kind in found[0] and "port-forward" in found[0], found
    assert isinstance(props["spec"]["ports"][0]["port"], float)  # as the engine sends numbers


# -------------------------------------------------------------------------------- behind IAP
IAP = {
    "domain": "notebooks.example.com",
    "members": ["group:ml-leads@example.com"],
    "teamMembers": {"research": ["group:research@example.com"]},
}
HOST = "research-notebook.notebooks.example.com"


@pytest.fixture(scope="module")
def teams_iap() -> ProgramRun:
    raw = _raw(REPO / "tests" / "data" / "Pulumi.teams.yaml")
    raw["ray-tpu:notebooks"] = {"iap": IAP}
    return run_program_detailed(parse_config(raw), stack="teams")


def _kind(resources: Iterable[DeclaredResource], kind: str) -> list[DeclaredResource]:
    return [r for r in resources if r.type.rsplit(":", 1)[-1] == kind]


def test_behind_iap_the_notebook_has_its_host_its_grants_and_still_its_token(
    teams_iap: ProgramRun,
) -> None:
    children = _children(teams_iap, "notebook-research-notebook")
    (backend,) = _kind(children, "BackendConfig")
    assert backend.props["spec"]["iap"] == {"enabled": True}
    assert backend.props["spec"]["healthCheck"] == {
        "type": "HTTP", "requestPath": "/api", "port": 8888.0,
    }  # fmt: skip
    assert backend.props["spec"]["timeoutSec"] == 3600  # a kernel's WebSocket lives this long
    (certificate,) = _kind(children, "ManagedCertificate")
    assert certificate.props["spec"]["domains"] == [HOST]
    (ingress,) = _kind(children, "Ingress")
    (rule,) = ingress.props["spec"]["rules"]
    assert rule["host"] == HOST
    backend_ref = rule["http"]["paths"][0]["backend"]["service"]
    assert backend_ref == {"name": "research-notebook", "port": {"number": 8888}}
    annotations = ingress.props["metadata"]["annotations"]
    assert annotations["kubernetes.io/ingress.allow-http"] == "false"
    (service,) = _kind(children, "Service")
    assert service.props["spec"]["type"] == "ClusterIP"
    assert (
        '"research-notebook-iap"'
        in service.props["metadata"]["annotations"]["cloud.google.com/backend-config"]
    )
    policies = {
        p.props["metadata"]["name"]: p.props["spec"] for p in _kind(children, "NetworkPolicy")
    }
    (admitted,) = policies["research-notebook-from-gfe"]["ingress"]
    assert {b["ipBlock"]["cidr"] for b in admitted["from"]} == {"35.191.0.0/16", "130.211.0.0/22"}
    assert policies["research-notebook"]["ingress"] == []  # no pod reaches it
    grants = [
        r for r in children if r.type == "gcp:iap/webTypeComputeIamMember:WebTypeComputeIamMember"
    ]
    assert sorted(g.props["member"] for g in grants) == [
        "group:ml-leads@example.com", "group:research@example.com",
    ]  # fmt: skip
    assert {g.props["condition"]["expression"] for g in grants} == {f'request.host == "{HOST}"'}
    env = {e["name"]: e for e in _container(teams_iap, "notebook-research-notebook")["env"]}
    assert "secretKeyRef" in env["JUPYTER_TOKEN"]["valueFrom"]
    outputs = teams_iap.outputs["notebooks"]["research-notebook"]
    assert outputs["url"] == f"https://{HOST}/" and "iapAddress" in outputs


def test_behind_iap_every_object_passes_its_schema_and_every_policy(teams_iap: ProgramRun) -> None:
    declared = [r for r in teams_iap.resources if "notebook" in r.name]
    report = schema_check.check(declared)
    assert [v.message for v in report.violations] == []
    core = {r.type.rsplit(":", 1)[-1] for r in declared if k8s_schemas.is_core(r.type)}
    assert {"Ingress", "Service", "NetworkPolicy", "Deployment"} <= core
    assert [(v.policy, v.message) for v in evaluate(teams_iap.resources)] == []


def test_an_ingress_to_the_notebook_without_iap_is_refused(teams_iap: ProgramRun) -> None:
    resources = []
    for resource in teams_iap.resources:
        if resource.type.endswith(":BackendConfig") and "notebook" in resource.name:
            props = copy.deepcopy(resource.props)
            props["spec"]["iap"]["enabled"] = False
            resource = dataclasses.replace(resource, props=props)
        resources.append(resource)
    found = [v.message for v in evaluate(resources) if v.policy == "ray-dashboard-behind-iap"]
    assert len(found) == 1, found
    assert "a Jupyter server" in found[0] and "spec.iap.enabled False" in found[0]
    assert "ray-tpu:notebooks.iap" in found[0]  # how to fix it


BAD_IAP = {
    "bad-domain": (
        {"domain": "*.example.com", "members": ["group:a@example.com"]},
        "ray-tpu:notebooks.iap.domain: '*.example.com' is not valid",
    ),
    "bad-member": (
        {"domain": "nb.example.com", "members": ["allUsers"]},
        "ray-tpu:notebooks.iap.members[0]: 'allUsers' is not valid",
    ),
    "unknown-team": (
        {"domain": "nb.example.com", "teamMembers": {"ops": ["group:a@example.com"]}},
        "ray-tpu:notebooks.iap.teamMembers.ops: 'ops' is not valid; valid: research",
    ),
    "no-one-passes": (
        {"domain": "nb.example.com"},
        "ray-tpu:notebooks.iap.members: is required",
    ),
    "unknown-key": (
        {"domain": "nb.example.com", "member": ["group:a@example.com"]},
        "ray-tpu:notebooks.iap.member",
    ),
}


@pytest.mark.parametrize(("iap", "message"), BAD_IAP.values(), ids=BAD_IAP.keys())
def test_a_bad_iap_section_names_the_field_and_the_valid_values(iap, message: str) -> None:
    raw = _raw(REPO / "tests" / "data" / "Pulumi.teams.yaml")
    raw["ray-tpu:notebooks"] = {"iap": iap}
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert any(e.startswith(message) for e in caught.value.errors), caught.value.errors
