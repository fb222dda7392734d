"""The Ray Dashboard through IAP (``ray-tpu:security.dashboardIap``): the config key and its
errors, what the program declares under Pulumi mocks (tests/data/Pulumi.iap.yaml and a RayService
variant), the GKE objects' shape (BackendConfig and ManagedCertificate: a pure check, their CRDs
are not vendored), and the stack policy ``ray-dashboard-behind-iap`` on the program's own
resources and on broken ones."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError, StackConfig
from infra.config.stack import load_stack_file, parse_config
from infra.offline import DeclaredResource, ProgramRun, run_program_detailed
from policies.evaluation import evaluate
from policies.rules.dashboard_iap import check_dashboard_ingress
from raytpu import gke_iap
from raytpu.ray_names import DASHBOARD_PORT

REPO = Path(__file__).resolve().parents[1]
IAP_STACK = Path(__file__).parent / "data" / "Pulumi.iap.yaml"
POLICY = "ray-dashboard-behind-iap"
ANNOTATION = ("metadata", "annotations", gke_iap.BACKEND_CONFIG_ANNOTATION)
SERVICE = "kubernetes:core/v1:Service"
INGRESS = "kubernetes:networking.k8s.io/v1:Ingress"
BACKEND_CONFIG = "kubernetes:cloud.google.com/v1:BackendConfig"
CERTIFICATE = "kubernetes:networking.gke.io/v1:ManagedCertificate"
IAM = "gcp:iap/webTypeComputeIamMember:WebTypeComputeIamMember"
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def _raw(**iap: Any) -> dict[str, Any]:
    raw = yaml.safe_load(IAP_STACK.read_text())["config"]
    raw["ray-tpu:security"] = {"dashboardIap": {**raw["ray-tpu:security"]["dashboardIap"], **iap}}
    return raw


@pytest.fixture(scope="module")
def stack() -> StackConfig:
    return load_stack_file(IAP_STACK)


@pytest.fixture(scope="module")
def run(stack: StackConfig) -> ProgramRun:
    return run_program_detailed(stack, stack="iap")


@pytest.fixture(scope="module")
def service_run() -> ProgramRun:
    """The RayService (token Secret) with a custom OAuth client."""
    config = parse_config(_raw(rayObject="serve", oauthSecret="iap-oauth"))
    return run_program_detailed(config, stack="iap")


def _one(run: ProgramRun, type_: str, name: str | None = None) -> DeclaredResource:
    found = [r for r in run.of_type(type_) if name is None or r.props["metadata"]["name"] == name]
    assert len(found) == 1, [r.name for r in found]
    return found[0]


# ----------------------------------------------------------------------------- config
def test_config_is_read(stack: StackConfig) -> None:
    iap = stack.security.dashboard_iap
    assert iap is not None
    assert (iap.kind, iap.name, iap.namespace, iap.host) == (
        "RayCluster",
        "train",
        "ray",
        "ray-dev.example.com",
    )
    assert iap.members == ("group:ml@example.com", "user:alice@example.com")
    assert iap.oauth_secret is None


def test_bare_name_finds_the_rayservice() -> None:
    iap = parse_config(_raw(rayObject="serve")).security.dashboard_iap
    assert iap is not None and iap.kind == "RayService"


def test_off_by_default() -> None:
    raw = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    assert parse_config(raw).security.dashboard_iap is None


P = "ray-tpu:security.dashboardIap"
BAD_CONFIG = [
    ("uppercase-host", {"host": "Ray.Example.com"}, f"{P}.host: 'Ray.Example.com' is not valid"),
    ("wildcard-host", {"host": "*.example.com"}, f"{P}.host: '*.example.com' is not valid"),
    ("single-label-host", {"host": "localhost"}, f"{P}.host: 'localhost' is not valid"),
    ("url-not-host", {"host": "https://ray.example.com"}, f"{P}.host: 'https://"),
    ("member-without-type", {"members": ["ml@example.com"]}, f"{P}.members[0]: 'ml@example.com'"),
    ("all-users", {"members": ["group:ml@example.com", "allUsers"]}, f"{P}.members[1]: 'allUsers'"),
    (
        "all-authenticated",
        {"members": ["allAuthenticatedUsers"]},
        f"{P}.members[0]: 'allAuthenticatedUsers' is not valid; valid: user:EMAIL",
    ),
    ("bad-email", {"members": ["user:alice"]}, f"{P}.members[0]: 'user:alice'"),
    ("empty-members", {"members": []}, f"{P}.members: [] is not valid"),
    ("missing-members", {"members": None}, f"{P}.members: is required"),
    ("missing-host", {"host": None}, f"{P}.host: is required"),
    (
        "unknown-object",
        {"rayObject": "RayCluster/nope"},
        f"{P}.rayObject: 'RayCluster/nope' is not valid; valid: RayCluster/train, RayService/serve",
    ),
    (
        "wrong-kind",
        {"rayObject": "RayService/train"},
        f"{P}.rayObject: 'RayService/train' is not valid",
    ),
    ("rayjob", {"rayObject": "RayJob/train"}, f"{P}.rayObject: 'RayJob/train' is not valid"),
    ("bad-oauth-secret", {"oauthSecret": "Bad_Name"}, f"{P}.oauthSecret: 'Bad_Name' is not valid"),
    ("unknown-key", {"hosts": ["a.example.com"]}, f"{P}.hosts: 'hosts' is not valid"),
]


@pytest.mark.parametrize(
    ("iap", "message"), [b[1:] for b in BAD_CONFIG], ids=[b[0] for b in BAD_CONFIG]
)
def test_bad_config_is_refused(iap: dict[str, Any], message: str) -> None:
    raw = _raw(**iap)
    section = raw["ray-tpu:security"]["dashboardIap"]
    for key in [k for k, v in section.items() if v is None]:
        del section[key]
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert any(e.startswith(message) for e in caught.value.errors), caught.value.errors


def test_rayjob_error_says_why() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw(rayObject="RayJob/train"))
    assert "a RayJob's Ray cluster lives only while its job runs" in str(caught.value)


# ----------------------------------------------------------------------------- the program
def test_component_owns_every_piece(run: ProgramRun) -> None:
    (component,) = [r for r in run.resources if r.type == "ray-tpu:infra:DashboardIap"]
    children = [r for r in run.resources if r.parent == component.urn]
    assert sorted({r.type.rsplit(":", 1)[-1] for r in children}) == [
        "BackendConfig",
        "ConfigMap",
        "Deployment",
        "GlobalAddress",
        "Ingress",
        "ManagedCertificate",
        "NetworkPolicy",
        "RoleBinding",
        "Secret",
        "Service",
        "ServiceAccount",
        "WebTypeComputeIamMember",
    ]
    (ray,) = run.of_type("kubernetes:ray.io/v1:RayCluster")
    deployment = _one(run, "kubernetes:apps/v1:Deployment")
    assert ray.urn in deployment.dependencies  # the Ray object (and its Role) first


def test_proxy_adds_the_token_from_a_secret(run: ProgramRun, service_run: ProgramRun) -> None:
    for current, secret, key in (
        (run, "train-dashboard-proxy-token", "token"),
        (service_run, "serve-ray-auth", "auth_token"),
    ):
        pod = _one(current, "kubernetes:apps/v1:Deployment").props["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAYTPU_RAY_TOKEN"] == {
            "name": "RAYTPU_RAY_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": secret, "key": key}},
        }
        assert pod["automountServiceAccountToken"] is False
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        template = _one(current, "kubernetes:core/v1:ConfigMap").props["data"][
            "default.conf.template"
        ]
        assert 'Authorization "Bearer ${RAYTPU_RAY_TOKEN}"' in template
        name = secret.split("-")[0]
        assert f"proxy_pass http://{name}-head-svc.ray.svc.cluster.local:{DASHBOARD_PORT};" in (
            template
        )
        assert "limit_except GET HEAD" in template and "return 403" in template


def test_rbac_cluster_proxy_has_its_own_ray_write_token(run: ProgramRun) -> None:
    token = _one(run, "kubernetes:core/v1:Secret", "train-dashboard-proxy-token")
    assert token.props["type"] == "kubernetes.io/service-account-token"
    assert token.props["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "train-dashboard-proxy"
    }
    binding = _one(
        run, "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding", "train-dashboard-proxy"
    )
    assert binding.props["roleRef"]["name"] == "train-ray-write"
    assert binding.props["subjects"] == [
        {"kind": "ServiceAccount", "name": "train-dashboard-proxy", "namespace": "ray"}
    ]


def test_token_secret_object_gets_no_service_account_token(service_run: ProgramRun) -> None:
    names = [r.props["metadata"]["name"] for r in service_run.of_type("kubernetes:core/v1:Secret")]
    assert "serve-dashboard-proxy-token" not in names
    assert not [
        r
        for r in service_run.of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
        if "dashboard" in r.props["metadata"]["name"]
    ]


def test_service_names_a_backend_config_with_iap(run: ProgramRun, service_run: ProgramRun) -> None:
    service = _one(run, SERVICE, "train-dashboard-proxy")
    annotations = service.props["metadata"]["annotations"]
    assert json.loads(annotations[gke_iap.BACKEND_CONFIG_ANNOTATION]) == {
        "default": "train-dashboard-iap"
    }
    assert json.loads(annotations[gke_iap.NEG_ANNOTATION]) == {"ingress": True}
    assert service.props["spec"]["type"] == "ClusterIP"
    config = _one(run, BACKEND_CONFIG, "train-dashboard-iap")
    assert config.props["spec"]["iap"] == {"enabled": True}  # the Google-managed OAuth client
    assert gke_iap.validate_backend_config(config.props) == []
    custom = _one(service_run, BACKEND_CONFIG, "serve-dashboard-iap").props["spec"]["iap"]
    assert custom == {"enabled": True, "oauthclientCredentials": {"secretName": "iap-oauth"}}


def test_https_ingress_on_a_static_ip_with_a_managed_certificate(run: ProgramRun) -> None:
    certificate = _one(run, CERTIFICATE)
    assert certificate.props["spec"] == {"domains": ["ray-dev.example.com"]}
    assert gke_iap.validate_managed_certificate(certificate.props) == []
    address = _one(run, "gcp:compute/globalAddress:GlobalAddress")
    ingress = _one(run, INGRESS)
    assert ingress.props["metadata"]["annotations"] == {
        "kubernetes.io/ingress.class": "gce",
        "kubernetes.io/ingress.global-static-ip-name": address.props["name"],
        "networking.gke.io/managed-certificates": "train-dashboard-cert",
        "kubernetes.io/ingress.allow-http": "false",
    }
    (rule,) = ingress.props["spec"]["rules"]
    assert rule["host"] == "ray-dev.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "train-dashboard-proxy", "port": {"number": 80.0}}
    assert run.outputs["dashboardIap"]["url"] == "https://ray-dev.example.com/"
    assert run.outputs["dashboardIap"]["addressName"] == address.props["name"]


def test_iap_access_for_the_members_on_this_host_only(run: ProgramRun) -> None:
    grants = run.of_type(IAM)
    assert sorted(g.props["member"] for g in grants) == [
        "group:ml@example.com",
        "user:alice@example.com",
    ]
    for grant in grants:
        assert grant.props["role"] == "roles/iap.httpsResourceAccessor"
        assert grant.props["project"] == "ray-tpu-dev"
        assert grant.props["condition"]["expression"] == 'request.host == "ray-dev.example.com"'
    assert not run.of_type("gcp:projects/iAMMember:IAMMember") or all(
        m.props["role"] != "roles/iap.httpsResourceAccessor"
        for m in run.of_type("gcp:projects/iAMMember:IAMMember")
    )


def test_network_policies_admit_only_gfe_and_the_proxy(run: ProgramRun) -> None:
    proxy = _one(run, NETWORK_POLICY, "train-dashboard-proxy").props["spec"]
    assert proxy["podSelector"]["matchLabels"][gke_iap.DASHBOARD_PROXY_LABEL] == "train"
    (rule,) = proxy["ingress"]
    assert [p["ipBlock"]["cidr"] for p in rule["from"]] == ["35.191.0.0/16", "130.211.0.0/22"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8090.0}]
    head = _one(run, NETWORK_POLICY, "train-dashboard-from-proxy").props["spec"]
    assert head["podSelector"] == {"matchLabels": {"ray-tpu/ray-object": "train"}}
    (rule,) = head["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": proxy["podSelector"]["matchLabels"]}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": float(DASHBOARD_PORT)}]


# ----------------------------------------------------------------------------- the policy
def test_the_program_passes_every_policy(run: ProgramRun, service_run: ProgramRun) -> None:
    for current in (run, service_run):
        assert [v.message for v in evaluate(current.resources)] == []


def _edited(run: ProgramRun, type_: str, change: Any) -> list[DeclaredResource]:
    """The program's resources with ``change(props)`` applied to the one of ``type_``."""
    out = []
    for r in run.resources:
        if r.type == type_ and "dashboard" in r.name:
            props = copy.deepcopy(r.props)
            change(props)
            r = dataclasses.replace(r, props=props)
        out.append(r)
    return out


def _set(path: str | tuple[str, ...], value: Any) -> Any:
    def change(props: dict[str, Any]) -> None:
        *parents, last = path.split("/") if isinstance(path, str) else path
        node = props
        for key in parents:
            node = node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value

    return change


BROKEN = [
    ("iap-off", BACKEND_CONFIG, _set("spec/iap/enabled", False), "has spec.iap.enabled False"),
    ("iap-missing", BACKEND_CONFIG, _set("spec/iap", None), "has spec.iap.enabled not set"),
    (
        "annotation-missing",
        SERVICE,
        _set(ANNOTATION, None),
        "its Service has no cloud.google.com/backend-config annotation",
    ),
    (
        "annotation-not-json",
        SERVICE,
        _set(ANNOTATION, "train-dashboard-iap"),
        'is not {"default": NAME}',
    ),
    (
        "annotation-names-another",
        SERVICE,
        _set(ANNOTATION, '{"default": "other"}'),
        "BackendConfig 'other' is not declared in namespace 'ray'",
    ),
    (
        "annotation-for-another-port",
        SERVICE,
        _set(
            ANNOTATION,
            '{"ports": {"9999": "train-dashboard-iap"}}',
        ),
        "names no BackendConfig for this port",
    ),
    (
        "proxy-load-balancer",
        SERVICE,
        _set("spec/type", "LoadBalancer"),
        "Service/train-dashboard-proxy: spec.type 'LoadBalancer' puts the Ray dashboard proxy",
    ),
]


@pytest.mark.parametrize(
    ("type_", "change", "text"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN]
)
def test_broken_endpoint_is_a_violation(
    run: ProgramRun, type_: str, change: Any, text: str
) -> None:
    found = [v for v in evaluate(_edited(run, type_, change)) if v.policy == POLICY]
    assert len(found) == 1 and text in found[0].message, [v.message for v in found]
    assert found[0].mandatory
    if "LoadBalancer" not in text:
        assert found[0].message.startswith(
            "Ingress/train-dashboard: spec.rules[0].http.paths[0].backend routes public traffic "
            "to service 'train-dashboard-proxy' (the Ray dashboard proxy of 'train') without IAP"
        )
        assert "ray-tpu:security.dashboardIap" in found[0].message  # how to fix


def test_port_named_in_the_annotation_counts(run: ProgramRun) -> None:
    named = '{"ports": {"http": "train-dashboard-iap"}}'
    change = _set(ANNOTATION, named)
    assert not [v for v in evaluate(_edited(run, SERVICE, change)) if v.policy == POLICY]


class _R:
    def __init__(self, type_: str, props: dict[str, Any]) -> None:
        self.type, self.props = type_, props
        self.name = self.urn = props["metadata"]["name"]


def _ingress(service: str, port: Any, **annotations: str) -> _R:
    backend = {"service": {"name": service, "port": port}}
    meta = {"name": "dash", "namespace": "ray", "annotations": annotations}
    return _R(INGRESS, {"metadata": meta, "spec": {"defaultBackend": backend}})


def _head_service(**annotations: str) -> _R:
    meta = {"name": "train-head-svc", "namespace": "ray", "annotations": annotations}
    return _R(
        SERVICE, {"metadata": meta, "spec": {"ports": [{"name": "dashboard", "port": 8265.0}]}}
    )


IAP_ON = _R(
    BACKEND_CONFIG,
    {"metadata": {"name": "iap", "namespace": "ray"}, "spec": {"iap": {"enabled": True}}},
)
HAND_WRITTEN = [
    ("straight-to-8265", [_ingress("train-head-svc", {"number": 8265.0}), _head_service()], 1),
    ("by-port-name", [_ingress("train-head-svc", {"name": "dashboard"}), _head_service()], 1),
    ("undeclared-service", [_ingress("elsewhere", {"number": 8265.0})], 1),
    (
        "internal-ingress",
        [
            _ingress(
                "train-head-svc",
                {"number": 8265.0},
                **{"kubernetes.io/ingress.class": "gce-internal"},
            )
        ],
        0,
    ),
    (
        "iap-on-the-head",
        [
            _ingress("train-head-svc", {"number": 8265.0}),
            _head_service(**{gke_iap.BACKEND_CONFIG_ANNOTATION: '{"default": "iap"}'}),
            IAP_ON,
        ],
        0,
    ),
    ("other-port", [_ingress("train-head-svc", {"number": 8000.0}), _head_service()], 0),
    (
        "unknown-port",
        [_ingress("train-head-svc", {"number": "04da6b54-80e4-46f7-96ec-b56ff0331ba9"})],
        0,
    ),
]


@pytest.mark.parametrize(
    ("resources", "count"), [h[1:] for h in HAND_WRITTEN], ids=[h[0] for h in HAND_WRITTEN]
)
def test_hand_written_ingresses(resources: list[Any], count: int) -> None:
    found = check_dashboard_ingress(resources)
    assert len(found) == count, found
    if count:
        assert "the Ray dashboard port 8265" in found[0] and "without IAP" in found[0]


def test_straight_to_8265_is_still_blocked_by_no_public_ray_head() -> None:
    """IAP on the head's own Service does not make a direct route right: the head wants its
    token, and only the proxy adds it."""
    resources = [
        _ingress("train-head-svc", {"number": 8265.0}),
        _head_service(**{gke_iap.BACKEND_CONFIG_ANNOTATION: '{"default": "iap"}'}),
        IAP_ON,
    ]
    policies = {v.policy for v in evaluate(resources)}
    assert policies == {"no-public-ray-head"}


# ----------------------------------------------------------------------------- GKE objects
GOOD_BACKEND = {
    "apiVersion": "cloud.google.com/v1",
    "kind": "BackendConfig",
    "metadata": {"name": "b"},
    "spec": {"iap": {"enabled": True}},
}
BAD_GKE = [
    (
        "beta-api",
        gke_iap.validate_backend_config,
        {"apiVersion": "cloud.google.com/v1beta1"},
        "apiVersion",
    ),
    (
        "enabled-string",
        gke_iap.validate_backend_config,
        {"spec": {"iap": {"enabled": "true"}}},
        "spec.iap.enabled",
    ),
    (
        "credentials-shape",
        gke_iap.validate_backend_config,
        {"spec": {"iap": {"enabled": True, "oauthclientCredentials": {"clientID": "x"}}}},
        "spec.iap.oauthclientCredentials",
    ),
    (
        "unknown-field",
        gke_iap.validate_backend_config,
        {"spec": {"iapp": {}}},
        "spec.iapp: unknown field",
    ),
    (
        "health-port-string",
        gke_iap.validate_backend_config,
        {"spec": {"healthCheck": {"port": "8090"}}},
        "spec.healthCheck.port",
    ),
    (
        "timeout-zero",
        gke_iap.validate_backend_config,
        {"spec": {"timeoutSec": 0}},
        "spec.timeoutSec",
    ),
    (
        "wildcard-domain",
        gke_iap.validate_managed_certificate,
        {
            "apiVersion": "networking.gke.io/v1",
            "kind": "ManagedCertificate",
            "spec": {"domains": ["*.example.com"]},
        },
        "spec.domains[0]",
    ),
    (
        "no-domains",
        gke_iap.validate_managed_certificate,
        {"apiVersion": "networking.gke.io/v1", "kind": "ManagedCertificate", "spec": {}},
        "spec.domains",
    ),
]


@pytest.mark.parametrize(
    ("check", "change", "field"), [b[1:] for b in BAD_GKE], ids=[b[0] for b in BAD_GKE]
)
def test_gke_object_checks(check: Any, change: dict[str, Any], field: str) -> None:
    manifest = {**GOOD_BACKEND, **change}
    problems = check(manifest)
    assert any(p.startswith(field) for p in problems), problems
    assert gke_iap.validate_backend_config(GOOD_BACKEND) == []


# ----------------------------------------------------------------------------- raytpu check
def _manifests(iap_enabled: bool) -> list[dict[str, Any]]:
    """What the program declares for the endpoint, as plain manifests, with IAP on or off."""
    from infra.manifests import dashboard_iap as spec

    iap = parse_config(_raw()).security.dashboard_iap
    assert iap is not None
    backend = spec.backend_config(iap)
    backend["spec"]["iap"]["enabled"] = iap_enabled
    service = {"apiVersion": "v1", "kind": "Service", **spec.service(iap)}
    ingress = {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", **spec.ingress(iap, "ip")}
    return [backend, service, ingress]


@pytest.mark.parametrize(("iap_enabled", "code"), [(True, 0), (False, 1)], ids=["iap", "no-iap"])
def test_raytpu_check_on_manifests(capsys, tmp_path: Path, iap_enabled: bool, code: int) -> None:
    from raytpu_cli.main import main

    path = tmp_path / "dashboard.yaml"
    path.write_text(yaml.safe_dump_all(_manifests(iap_enabled)))
    assert main(["check", str(path)]) == code
    out = capsys.readouterr().out
    assert (POLICY in out) == (not iap_enabled), out


@pytest.mark.parametrize(
    ("iap", "expected"),
    [
        (None, None),
        (
            {"url": "https://ray-dev.example.com/", "address": "1.2.3.4"},
            "https://ray-dev.example.com/",
        ),
    ],
    ids=["no-endpoint", "endpoint"],
)
def test_stack_outputs_carry_the_iap_url(iap: Any, expected: str | None) -> None:
    from raytpu.stack_outputs import parse_outputs

    raw = {"clusterName": "c", "slices": {}, "rayClusters": {}}
    if iap is not None:
        raw["dashboardIap"] = iap
    assert parse_outputs(raw, "dev").dashboard_iap_url == expected


def test_stack_outputs_refuse_a_plain_http_iap_url() -> None:
    from raytpu.stack_outputs import StackOutputsError, parse_outputs

    raw = {"clusterName": "c", "slices": {}, "rayClusters": {}}
    raw["dashboardIap"] = {"url": "http://ray-dev.example.com/"}
    with pytest.raises(StackOutputsError, match=r"outputs.dashboardIap.url: .* valid: an https"):
        parse_outputs(raw, "dev")
