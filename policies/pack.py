"""The policy pack as data: one :class:`PolicySpec` per policy, and the policy config.

``policies/__main__.py`` turns :data:`POLICIES` into ``pulumi_policy`` objects for
``pulumi preview --policy-pack policies``; ``raytpu preview`` and ``raytpu check`` run the same
list through :func:`policies.evaluation.evaluate`. Enforcement is mandatory unless policy config says otherwise,
in Pulumi's own policy-config format (``--policy-pack-config``)::

    {"all": "advisory", "pinned-ray-version": {"enforcementLevel": "mandatory",
                                               "minimumVersion": "2.58.0"}}

A rule may also return :class:`policies.rules.Advisory` messages (the object works, but something
is worth changing). Those are reported under the companion policy ``<name>-advisory``, advisory by
default (also on the Pulumi engine, whose violations carry the level of the policy that reports
them); config can set that companion's level like any policy's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from policies.props import get
from policies.resources import CLUSTER, NODE_POOL, SERVICE, is_ingress, ray_kind
from policies.rules import (
    dashboard_iap,
    exposure,
    image,
    kueue,
    node_pool,
    notebook,
    ray_groups,
    ray_version,
    security,
    serve_llm,
    stack,
)
from raytpu.catalog import WORKLOAD_POLICY_TYPE
from raytpu.errors import invalid

ENFORCEMENT_LEVELS = ("mandatory", "advisory", "disabled")
DEFAULT_ENFORCEMENT = "mandatory"
ADVISORY_SUFFIX = "-advisory"
"""Companion policy of a policy whose rule returns :class:`Advisory` findings."""


class PolicyConfigError(ValueError):
    """Policy config that names an unknown policy, level or option."""


@dataclass(frozen=True)
class Option:
    """One policy config property: its JSON schema and the rule keyword it feeds."""

    key: str
    keyword: str
    schema: Mapping[str, Any]
    default: Any


@dataclass(frozen=True)
class PolicySpec:
    """One policy: what Pulumi shows, which resources it reads and the pure rule it runs."""

    name: str
    description: str
    kind: Literal["resource", "stack"]
    rule: Callable[..., list[str]]
    applies_to: Callable[[str], bool] = lambda _type: True
    """Resource policies: which type tokens the rule reads."""
    remediation: str = ""
    options: tuple[Option, ...] = field(default=())
    advisories: bool = False
    """The rule may return :class:`Advisory` findings (reported by ``<name>-advisory``)."""

    @property
    def advisory_name(self) -> str | None:
        return f"{self.name}{ADVISORY_SUFFIX}" if self.advisories else None

    def run(self, target: Any, config: Mapping[str, Any] | None = None) -> list[str]:
        """Violations of ``target`` (props of one resource, or the stack's resources)."""
        kwargs = {o.keyword: (config or {}).get(o.key, o.default) for o in self.options}
        return self.rule(target, **kwargs)


def _ray_rule(check: Callable[..., list[str]]) -> Callable[..., list[str]]:
    def rule(props: Mapping[str, Any], **kwargs: Any) -> list[str]:
        return check(props, None, **kwargs)

    rule.__name__ = check.__name__
    rule.__doc__ = check.__doc__
    return rule


def _exposure(props: Mapping[str, Any]) -> list[str]:
    """Dispatches on the object's kind: Service, Ingress or a KubeRay object."""
    kind = props.get("kind") if isinstance(props, Mapping) else None
    if kind is None:  # no kind stated: recognise the spec's shape
        if get(props, "spec.rules") is not None or get(props, "spec.defaultBackend") is not None:
            kind = "Ingress"
        elif get(props, "spec.ports") is not None:
            kind = "Service"
    if kind == "Service":
        return exposure.check_service(props)
    if kind == "Ingress":
        return exposure.check_ingress(props)
    return exposure.check_ray_head_service(props)


def _is_ray(resource_type: str) -> bool:
    return ray_kind(resource_type) is not None


def _is_exposure_target(resource_type: str) -> bool:
    return resource_type == SERVICE or is_ingress(resource_type) or _is_ray(resource_type)


POLICIES: tuple[PolicySpec, ...] = (
    PolicySpec(
        name="tpu-node-pool-shape",
        description=(
            "A TPU node pool is one real slice: known machine type, topology legal for its "
            "generation, no tpuTopology on single-host pools, multi-host pools COMPACT (tpu7x: a "
            "workload policy) with node count == hosts, whole-slice autoscaling and one zone."
        ),
        kind="resource",
        rule=node_pool.check_node_pool,
        applies_to=lambda t: t == NODE_POOL,
        remediation="Fix the node pool to the shape `raytpu catalog GEN TOPOLOGY` prints.",
        advisories=True,
    ),
    PolicySpec(
        name="ray-tpu-worker-groups",
        description=(
            "Every KubeRay worker group that requests google.com/tpu has numOfHosts == hosts of "
            "its topology and chips per host, TPU requests == limits, and both GKE TPU node "
            "selectors naming a real slice (stricter than GKE's TPU webhook, never looser)."
        ),
        kind="resource",
        rule=_ray_rule(ray_groups.check_worker_groups),
        applies_to=_is_ray,
        remediation="Set numOfHosts, google.com/tpu and the node selectors from `raytpu catalog`.",
        advisories=True,
    ),
    PolicySpec(
        name="tpu-slices-for-ray-groups",
        description=(
            "Every TPU worker group has node pools of its exact shape with enough slices for "
            "the replicas of all groups of that shape."
        ),
        kind="stack",
        rule=stack.check_slices_for_groups,
        remediation="Add node pools (slice count) of the group's shape, or lower replicas.",
    ),
    PolicySpec(
        name="rayservice-upgrade-capacity",
        description=(
            "A RayService upgraded blue-green (upgradeStrategy NewCluster, KubeRay's default) "
            "has node pools with its slices a second time, beside every group's."
        ),
        kind="stack",
        rule=stack.check_upgrade_capacity,
        remediation=(
            "Set upgradeStrategy.type None (in place; the stack key rayServices[].upgradeStrategy), "
            "or add slices of the shape for the second RayCluster."
        ),
    ),
    PolicySpec(
        name="ray-operator-addon",
        description="A GKE cluster that runs KubeRay objects has the Ray Operator add-on enabled.",
        kind="stack",
        rule=stack.check_ray_operator_addon,
        remediation="Set addonsConfig.rayOperatorConfigs = [{enabled: true}] on the cluster.",
    ),
    PolicySpec(
        name="tpu7x-workload-policy",
        description=(
            "A tpu7x node pool's workload policy is declared and its acceleratorTopology makes "
            "a real slice with the pool's node count."
        ),
        kind="stack",
        rule=stack.check_workload_policies,
        remediation=(
            f"Declare the ResourcePolicy ({WORKLOAD_POLICY_TYPE}, acceleratorTopology) in the stack."
        ),
        advisories=True,
    ),
    PolicySpec(
        name="pinned-ray-version",
        description=(
            "A KubeRay object names one explicit Ray version, one the upgrade matrix passed "
            f"({ray_version.DEFAULT_MINIMUM_VERSION} to {ray_version.DEFAULT_MAXIMUM_VERSION}), "
            "in rayVersion and in every Ray image tag; no latest, no untagged image."
        ),
        kind="resource",
        rule=_ray_rule(ray_version.check_ray_version),
        applies_to=_is_ray,
        remediation="Pin rayVersion and image tags to the same Ray release, e.g. 2.60.0.",
        options=(
            Option(
                key="minimumVersion",
                keyword="minimum_version",
                schema={"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
                default=ray_version.DEFAULT_MINIMUM_VERSION,
            ),
            Option(
                key="maximumVersion",
                keyword="maximum_version",
                schema={"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
                default=ray_version.DEFAULT_MAXIMUM_VERSION,
            ),
        ),
    ),
    PolicySpec(
        name="image-has-the-code",
        description=(
            "A RayService or RayJob that starts this project's code (workloads.serve:app, "
            "python -m raytpu_cli ...) runs the worker image built from Dockerfile, not the "
            "stock rayproject/ray image, which lacks that code and jax[tpu]."
        ),
        kind="resource",
        rule=_ray_rule(image.check_image_has_code),
        applies_to=_is_ray,
        remediation=(
            "Build and push the Dockerfile image; leave ray-tpu:rayImage unset and set "
            "ray-tpu:imageTag to its tag (or set rayImage to it)."
        ),
    ),
    PolicySpec(
        name="no-public-ray-head",
        description=(
            "No Ray head dashboard (8265), client (10001) or GCS (6379) port behind a "
            "LoadBalancer Service, a public Ingress or a KubeRay head serviceType LoadBalancer: "
            "Ray has no authentication."
        ),
        kind="resource",
        rule=_exposure,
        applies_to=_is_exposure_target,
        remediation="Use ClusterIP and kubectl port-forward or IAP to reach the Ray head.",
    ),
    PolicySpec(
        name="ray-dashboard-behind-iap",
        description=(
            "A public Ingress reaches a Ray dashboard (its port, or the proxy labelled "
            "ray-tpu/dashboard-proxy) or a Jupyter server (pods app.kubernetes.io/name: "
            "jupyterlab, or port 8888) only through a BackendConfig with spec.iap.enabled; the "
            "dashboard proxy's Service is never a LoadBalancer."
        ),
        kind="stack",
        rule=dashboard_iap.check_dashboard_ingress,
        remediation=(
            "Use ray-tpu:security.dashboardIap or ray-tpu:notebooks.iap, or annotate the Service "
            "with an IAP BackendConfig."
        ),
    ),
    PolicySpec(
        name="notebook-token-auth",
        description=(
            "A Jupyter server (Deployment, StatefulSet or Pod running jupyter) takes its token "
            "from a Secret (never empty, never literal) and keeps the XSRF check; no LoadBalancer "
            "or NodePort Service exposes one: a notebook runs arbitrary code with its credentials."
        ),
        kind="resource",
        rule=notebook.check_notebook,
        applies_to=notebook.applies_to,
        remediation=(
            "Set JUPYTER_TOKEN from a secretKeyRef (ray-tpu:notebooks does), keep the Service "
            "ClusterIP and use `raytpu notebook --stack`."
        ),
    ),
    PolicySpec(
        name="ray-token-auth",
        description=(
            "Every RayCluster, RayService and RayJob runs Ray with token authentication "
            "(authOptions.mode: token): Ray's dashboard, client and GCS ports run arbitrary code."
        ),
        kind="resource",
        rule=_ray_rule(security.check_ray_auth),
        applies_to=_is_ray,
        remediation=(
            "Set authOptions {mode: token, enableK8sTokenAuth: true} (RayCluster) or "
            "{mode: token}; relax this policy in policy config only with a reason."
        ),
    ),
    PolicySpec(
        name="no-plain-secrets",
        description=(
            "No literal credential (a TOKEN / SECRET / PASSWORD / KEY variable) in a Ray pod's "
            "env or a runtimeEnv's env_vars."
        ),
        kind="resource",
        rule=_ray_rule(security.check_secret_values),
        applies_to=_is_ray,
        remediation="Keep credentials in Kubernetes Secrets and reference them (secretKeyRef).",
    ),
    PolicySpec(
        name="ray-network-policy",
        description="Every namespace declared with a KubeRay object in it has a NetworkPolicy around Ray's ports.",
        kind="stack",
        rule=security.check_network_policies,
        remediation=(
            "Declare a NetworkPolicy that admits only the Ray object's pods, the metrics scraper "
            "and the KubeRay operator (the program does: infra/manifests/ray_access.py)."
        ),
    ),
    PolicySpec(
        name="kueue-queue-label",
        description=(
            "A KubeRay object in a team's namespace (one with Kueue LocalQueues) names one of "
            "them in kueue.x-k8s.io/queue-name, so Kueue admits it against the team's quota."
        ),
        kind="stack",
        rule=kueue.check_queue_labels,
        remediation="Give the object a team in the stack (ray-tpu:rayJobs[].team) or the label.",
    ),
    PolicySpec(
        name="kueue-whole-slice-quota",
        description=(
            "A ClusterQueue's google.com/tpu quota, borrowing and lending limits on a TPU flavor "
            "are whole slices of that flavor's shape (Kueue admits slices whole)."
        ),
        kind="stack",
        rule=kueue.check_whole_slice_quotas,
        remediation="Set quotas in whole slices (ray-tpu:teams[].quotas[].slices).",
    ),
    PolicySpec(
        name="kueue-quota-capacity",
        description=(
            "Per TPU flavor, the ClusterQueues' nominal quotas add up to no more than the node "
            "pools of that flavor can ever hold."
        ),
        kind="stack",
        rule=kueue.check_quota_capacity,
        remediation="Lower the teams' quotas or add slices of that flavor.",
    ),
    PolicySpec(
        name="kueue-flavor-node-pools",
        description="Every TPU ResourceFlavor's nodeLabels match at least one TPU node pool.",
        kind="stack",
        rule=kueue.check_flavor_node_pools,
        remediation="Add a slice of the flavor's shape and provisioning, or fix its labels.",
    ),
    PolicySpec(
        name="kueue-priority-class",
        description=(
            "Every kueue.x-k8s.io/priority-class label names a declared WorkloadPriorityClass."
        ),
        kind="stack",
        rule=kueue.check_priority_classes,
        remediation="Use a class of ray-tpu:priorityClasses, or declare the one you need.",
    ),
    PolicySpec(
        name="workload-identity",
        description="A GKE cluster runs Workload Identity (workloadIdentityConfig.workloadPool).",
        kind="resource",
        rule=exposure.check_workload_identity,
        applies_to=lambda t: t == CLUSTER,
        remediation="Set workloadIdentityConfig.workloadPool to PROJECT.svc.id.goog.",
    ),
    PolicySpec(
        name="serve-llm-engine-uses-the-slice",
        description=(
            "A RayService serving with Ray Serve LLM (vLLM) runs tensor parallel over all chips "
            "of its single-host TPU worker group, on that generation's accelerator type, with "
            "prefix caching on, in an image tagged with the vllm-tpu its Ray version pins and "
            "py312."
        ),
        kind="resource",
        rule=serve_llm.check_llm_engine,
        applies_to=lambda t: ray_kind(t) == "RayService",
        remediation="Set rayServices[].engine: vllm in the stack and let the program write the "
        "LLMConfig (tensor_parallel_size = chips, accelerator_type, enable_prefix_caching) and "
        "pick the image Dockerfile.vllm builds (ray-vllm:<rayVersion>-py312-vllm-tpu<pin>-<tag>).",
    ),
)

BY_NAME: dict[str, PolicySpec] = {p.name: p for p in POLICIES}
COMPANIONS: dict[str, PolicySpec] = {p.advisory_name: p for p in POLICIES if p.advisory_name}
"""Advisory companions by name (``tpu-node-pool-shape-advisory``)."""


def policy_names() -> list[str]:
    """Every policy the pack reports under: each policy, then its advisory companion if any."""
    return [n for p in POLICIES for n in (p.name, p.advisory_name) if n]


# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Settings:
    """Enforcement level and options of each policy, after policy config."""

    levels: Mapping[str, str]
    options: Mapping[str, Mapping[str, Any]]


def settings(config: Mapping[str, Any] | None = None) -> Settings:
    """Reads Pulumi-style policy config; raises PolicyConfigError naming key, value, valid values."""
    config = dict(config or {})
    levels = {p.name: DEFAULT_ENFORCEMENT for p in POLICIES}
    levels.update(dict.fromkeys(COMPANIONS, "advisory"))
    options: dict[str, dict[str, Any]] = {p.name: {} for p in POLICIES}
    valid_names = ", ".join(["all", *policy_names()])
    if "all" in config:
        level = _level("all", config.pop("all"))
        levels = dict.fromkeys(levels, level)  # as Pulumi: every policy, companions included
    for name, value in config.items():
        if name in COMPANIONS and not isinstance(value, Mapping):
            levels[name] = _level(name, value)
            continue
        if name not in BY_NAME and name not in COMPANIONS:
            raise PolicyConfigError(f"{name}: {name!r} is not a policy; valid: {valid_names}")
        spec = BY_NAME.get(name) or COMPANIONS[name]
        if name in COMPANIONS:
            spec = PolicySpec(name, spec.description, spec.kind, spec.rule)  # no options
        if isinstance(value, str):
            levels[name] = _level(name, value)
            continue
        if not isinstance(value, Mapping):
            raise PolicyConfigError(
                invalid(
                    name,
                    value,
                    f"an enforcement level ({', '.join(ENFORCEMENT_LEVELS)}) or an object",
                )
            )
        for key, item in value.items():
            if key == "enforcementLevel":
                levels[name] = _level(f"{name}.enforcementLevel", item)
                continue
            keys = {o.key: o for o in spec.options}
            if key not in keys:
                valid = ", ".join(["enforcementLevel", *keys])
                raise PolicyConfigError(f"{name}.{key}: {key!r} is not an option; valid: {valid}")
            if key in ("minimumVersion", "maximumVersion") and (
                not isinstance(item, str) or ray_version.parse_version(item) is None
            ):
                raise PolicyConfigError(invalid(f"{name}.{key}", item, "X.Y.Z, e.g. 2.55.0"))
            options[name][key] = item
    return Settings(levels=levels, options=options)


def _level(key: str, value: Any) -> str:
    if value not in ENFORCEMENT_LEVELS:
        raise PolicyConfigError(invalid(key, value, ENFORCEMENT_LEVELS))
    return value


__all__ = [
    "ADVISORY_SUFFIX",
    "BY_NAME",
    "COMPANIONS",
    "POLICIES",
    "Option",
    "PolicyConfigError",
    "PolicySpec",
    "Settings",
    "policy_names",
    "settings",
]
