"""Security: token authentication on every Ray object, a NetworkPolicy around each, Dataplane V2,
no plain secrets; the policies that block the opposite; the config key that turns auth off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from policies_factories import cluster_spec, ray_object, resource, tpu_group

from infra.config.schema import ConfigError
from infra.config.stack import load_stack, parse_config
from infra.offline import ProgramRun, run_program_detailed
from policies.rules import security
from raytpu import catalog
from raytpu.ray_names import DASHBOARD_PORT, METRICS_PORT, SERVE_PORT
from raytpu_cli.main import main

REPO = Path(__file__).resolve().parents[1]
RAY_TYPES = {
    "RayCluster": "kubernetes:ray.io/v1:RayCluster",
    "RayService": "kubernetes:ray.io/v1:RayService",
    "RayJob": "kubernetes:ray.io/v1:RayJob",
}
NETWORK_POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
V6E_4X4 = catalog.shape("v6e", "4x4")


@pytest.fixture(scope="module")
def runs() -> dict[str, ProgramRun]:
    return {s: run_program_detailed(load_stack(s), stack=s) for s in ("dev", "prod")}


def _cluster_of(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]
    return spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or spec


# ------------------------------------------------------------------------- what is declared
@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_ray_object_has_token_auth(runs: dict[str, ProgramRun], stack: str) -> None:
    ray_objects = [r for r in runs[stack].resources if r.type in RAY_TYPES.values()]
    assert ray_objects
    for obj in ray_objects:
        options = _cluster_of(obj.props)["authOptions"]
        kind = obj.type.rsplit(":", 1)[-1]
        name = obj.props["metadata"]["name"]
        if kind == "RayCluster":  # Kubernetes-RBAC tokens (KubeRay supports them here only)
            assert options == {"mode": "token", "enableK8sTokenAuth": True}
        else:
            assert options == {"mode": "token", "secretName": f"{name}-ray-auth"}


def test_rbac_role_grants_ray_write_on_that_cluster_only(runs: dict[str, ProgramRun]) -> None:
    (role,) = runs["dev"].of_type("kubernetes:rbac.authorization.k8s.io/v1:Role")
    assert role.props["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": ["train"],
            "verbs": ["ray:write"],
        }
    ]
    (binding,) = runs["dev"].of_type("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")
    assert binding.props["roleRef"]["name"] == "train-ray-write"


def test_token_secret_is_generated_not_written(runs: dict[str, ProgramRun]) -> None:
    (secret,) = runs["dev"].of_type("kubernetes:core/v1:Secret")
    assert secret.props["metadata"]["name"] == "serve-ray-auth"
    data = secret.props["stringData"]
    data = data.get("value", data)  # the engine marks Secret data as secret: unwrap it
    assert set(data) == {"auth_token"}
    (password,) = runs["dev"].of_type("random:index/randomPassword:RandomPassword")
    assert password.props["length"] == 48
    assert "auth_token" not in json.dumps(runs["dev"].outputs)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_network_policy_guards_each_ray_object(runs: dict[str, ProgramRun], stack: str) -> None:
    policies = {r.props["metadata"]["name"]: r.props for r in runs[stack].of_type(NETWORK_POLICY)}
    names = [
        r.props["metadata"]["name"] for r in runs[stack].resources if r.type in RAY_TYPES.values()
    ]
    assert sorted(policies) == sorted(f"{n}-ray-ports" for n in names)
    for name in names:
        spec = policies[f"{name}-ray-ports"]["spec"]
        own = {"matchLabels": {"ray-tpu/ray-object": name}}
        assert spec["podSelector"] == own and spec["policyTypes"] == ["Ingress"]
        own_rule, scraper, operator = spec["ingress"]
        assert own_rule == {"from": [{"podSelector": own}]}
        assert scraper["ports"] == [{"protocol": "TCP", "port": METRICS_PORT}]
        assert scraper["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}}}
        ]
        assert operator["ports"] == [
            {"protocol": "TCP", "port": DASHBOARD_PORT},
            {"protocol": "TCP", "port": SERVE_PORT},
        ]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_pods_carry_the_label_their_policy_selects(runs: dict[str, ProgramRun], stack: str) -> None:
    for obj in (r for r in runs[stack].resources if r.type in RAY_TYPES.values()):
        cluster = _cluster_of(obj.props)
        name = obj.props["metadata"]["name"]
        for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
            assert group["template"]["metadata"]["labels"]["ray-tpu/ray-object"] == name


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_cluster_runs_dataplane_v2(runs: dict[str, ProgramRun], stack: str) -> None:
    (cluster,) = runs[stack].of_type("gcp:container/cluster:Cluster")
    assert cluster.props["datapathProvider"] == "ADVANCED_DATAPATH"


# ------------------------------------------------------------------------- config
def _dev_config(**security: Any) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    if security:
        raw["ray-tpu:security"] = security
    return raw


def test_auth_is_off_only_with_a_reason() -> None:
    config = parse_config(_dev_config(rayAuth="disabled", disabledReason="air-gapped lab"))
    assert config.security.ray_auth == "disabled"


@pytest.mark.parametrize(
    ("security", "message"),
    [
        ({"rayAuth": "disabled"}, "ray-tpu:security.disabledReason: is required"),
        (
            {"rayAuth": "none"},
            "ray-tpu:security.rayAuth: 'none' is not valid; valid: kubernetes, token, disabled",
        ),
        (
            {"rayAuth": "token", "disabledReason": "x"},
            "ray-tpu:security.disabledReason: 'x' is not valid",
        ),
        (
            {"operatorNamespaces": ["Bad_NS"]},
            "ray-tpu:security.operatorNamespaces: ['Bad_NS'] is not valid",
        ),
        ({"tls": True}, "ray-tpu:security.tls: 'tls' is not valid"),
    ],
    ids=[
        "disabled-without-reason",
        "unknown-mode",
        "reason-without-disabled",
        "bad-namespace",
        "unknown-key",
    ],
)
def test_bad_security_config_is_refused(security: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_dev_config(**security))
    assert any(e.startswith(message) for e in caught.value.errors), caught.value.errors


def test_token_mode_uses_secrets_everywhere() -> None:
    config = parse_config(_dev_config(rayAuth="token"))
    run = run_program_detailed(config, stack="dev")
    secrets = {r.props["metadata"]["name"] for r in run.of_type("kubernetes:core/v1:Secret")}
    assert secrets == {"train-ray-auth", "serve-ray-auth"}
    assert run.outputs["rayClusters"]["train"]["auth"] == "secret"


# ------------------------------------------------------------------------- the policies
def _group_with_env(env: list[dict[str, Any]]) -> dict[str, Any]:
    group = tpu_group(V6E_4X4)
    group["template"]["spec"]["containers"][0]["env"] = env
    return group


AUTH_CASES = [
    ("token", {"mode": "token"}, []),
    ("rbac", {"mode": "token", "enableK8sTokenAuth": True}, []),
    ("missing", None, ["spec.authOptions.mode: not set"]),
    ("disabled", {"mode": "disabled"}, ["spec.authOptions.mode: 'disabled'"]),
]


@pytest.mark.parametrize(("kind"), list(RAY_TYPES))
@pytest.mark.parametrize(
    ("options", "expected"), [c[1:] for c in AUTH_CASES], ids=[c[0] for c in AUTH_CASES]
)
def test_ray_token_auth_rule(kind: str, options: Any, expected: list[str]) -> None:
    spec = cluster_spec([tpu_group(V6E_4X4)])
    if options is None:
        del spec["authOptions"]
    else:
        spec["authOptions"] = options
    obj = ray_object(kind, "x", spec)
    found = security.check_ray_auth(obj, kind)
    prefix = {
        "RayCluster": "spec",
        "RayService": "spec.rayClusterConfig",
        "RayJob": "spec.rayClusterSpec",
    }[kind]
    expected = [e.replace("spec.", f"{prefix}.", 1) for e in expected]
    assert [f.split(";")[0] for f in found] == [e.split(";")[0] for e in expected]
    if expected:
        assert "enableK8sTokenAuth" in found[0] and "runs code" in found[0]


def test_manual_token_form_passes() -> None:
    """KubeRay < 1.5.1 (ray-cluster.auth-manual.yaml): RAY_AUTH_MODE=token + a Secret."""
    spec = cluster_spec(
        [
            _group_with_env(
                [
                    {"name": "RAY_AUTH_MODE", "value": "token"},
                    {
                        "name": "RAY_AUTH_TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "t", "key": "auth_token"}},
                    },
                ]
            )
        ]
    )
    del spec["authOptions"]
    spec["headGroupSpec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "RAY_AUTH_MODE", "value": "token"}
    ]
    assert security.check_ray_auth(ray_object("RayCluster", "x", spec)) == []
    assert security.check_secret_values(ray_object("RayCluster", "x", spec)) == []


SECRET_CASES = [
    ("literal-token", [{"name": "HF_TOKEN", "value": "hf_abc"}], ["HF_TOKEN"]),
    ("literal-api-key", [{"name": "OPENAI_API_KEY", "value": "sk-1"}], ["OPENAI_API_KEY"]),
    (
        "secret-ref",
        [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
        [],
    ),
    ("plain-setting", [{"name": "JAX_PLATFORMS", "value": "tpu"}], []),
    ("empty-value", [{"name": "DB_PASSWORD", "value": ""}], []),
]


@pytest.mark.parametrize(
    ("env", "names"), [c[1:] for c in SECRET_CASES], ids=[c[0] for c in SECRET_CASES]
)
def test_no_plain_secrets_in_pod_env(env: list[dict[str, Any]], names: list[str]) -> None:
    obj = ray_object("RayCluster", "x", cluster_spec([_group_with_env(env)]))
    found = security.check_secret_values(obj)
    assert [f.split(":")[0].rsplit(".", 1)[-1] for f in found] == names
    assert all("secretKeyRef" in f for f in found)


def test_no_plain_secrets_in_runtime_envs() -> None:
    serve = ray_object("RayService", "s", cluster_spec([tpu_group(V6E_4X4)]))
    serve["spec"]["serveConfigV2"] = yaml.safe_dump(
        {
            "applications": [
                {
                    "name": "a",
                    "import_path": "m:app",
                    "runtime_env": {"env_vars": {"HF_TOKEN": "hf_x", "MODE": "fast"}},
                }
            ]
        }
    )
    (found,) = security.check_secret_values(serve)
    assert found.startswith("spec.serveConfigV2.applications[0].runtime_env.env_vars.HF_TOKEN:")
    job = ray_object("RayJob", "j", cluster_spec([tpu_group(V6E_4X4)]))
    job["spec"]["runtimeEnvYAML"] = yaml.safe_dump({"env_vars": {"WANDB_API_KEY": "k"}})
    (found,) = security.check_secret_values(job)
    assert found.startswith("spec.runtimeEnvYAML.env_vars.WANDB_API_KEY:")


def _namespace(name: str) -> Any:
    return resource("kubernetes:core/v1:Namespace", f"ns-{name}", {"metadata": {"name": name}})


def _cluster_in(namespace: str) -> Any:
    obj = ray_object("RayCluster", "train", cluster_spec([tpu_group(V6E_4X4)]))
    obj["metadata"]["namespace"] = namespace
    return resource(RAY_TYPES["RayCluster"], "rc", obj)


def _policy_in(namespace: str) -> Any:
    return resource(NETWORK_POLICY, "np", {"metadata": {"name": "p", "namespace": namespace}})


@pytest.mark.parametrize(
    ("resources", "flagged"),
    [
        ([_namespace("ray"), _cluster_in("ray")], ["ray"]),
        ([_namespace("ray"), _cluster_in("ray"), _policy_in("ray")], []),
        ([_namespace("ray"), _cluster_in("ray"), _policy_in("other")], ["ray"]),
        ([_cluster_in("ray")], []),  # a lone manifest: its namespace is not declared here
    ],
    ids=["declared-unguarded", "guarded", "policy-elsewhere", "namespace-not-declared"],
)
def test_ray_namespace_needs_a_network_policy(resources: list[Any], flagged: list[str]) -> None:
    found = security.check_network_policies(resources)
    assert [f.split("'")[1] for f in found] == flagged
    assert all("declare one that admits only" in f for f in found)


# ------------------------------------------------------------------------- raytpu check
def _auth_sample(with_auth: bool) -> dict[str, Any]:
    """The shape of KubeRay's ray-cluster.auth.yaml sample, on our pinned Ray."""
    obj = ray_object("RayCluster", "ray-cluster-with-auth", cluster_spec([tpu_group(V6E_4X4)]))
    if not with_auth:
        del obj["spec"]["authOptions"]
    return obj


@pytest.mark.parametrize(("with_auth", "code"), [(True, 0), (False, 1)], ids=["auth", "no-auth"])
def test_raytpu_check_on_auth_manifests(capsys, tmp_path: Path, with_auth: bool, code: int) -> None:
    path = tmp_path / "ray-cluster.auth.yaml"
    path.write_text(yaml.safe_dump(_auth_sample(with_auth)))
    assert main(["check", str(path), "--json"]) == code
    result = json.loads(capsys.readouterr().out)
    policies = [v["policy"] for v in result["violations"]]
    assert policies == ([] if with_auth else ["ray-token-auth"])
    if not with_auth:
        assert "set authOptions: {mode: token" in result["violations"][0]["message"]


def test_declared_stacks_pass_the_security_policies(capsys) -> None:
    for stack in ("dev", "prod"):
        assert main(["preview", stack]) == 0, capsys.readouterr()
