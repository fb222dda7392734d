"""The checks of ``raytpu doctor``: what a stack declares against what its cluster runs.

Pure functions. In: the stack's Ray objects (:func:`declared_objects`, from the resources the
Pulumi program declares under mocks) and the Kubernetes API's answers, as dicts exactly as
``kubectl get KIND -o json`` prints their items (:class:`ClusterState`). Out: one :class:`Row`
per check, whose message says what is wrong and what to do. The slice check is in
:mod:`raytpu_cli.doctor_slices`.

Facts the checks lean on, from KubeRay's source (v1.7.0) and the TPU webhook's
(GoogleCloudPlatform/ai-on-gke, ray-on-gke/tpu/kuberay-tpu-webhook, which the GKE Ray add-on
hosts):

- A field the CRD's schema does not know is dropped by the API server without an error: a
  RayCluster's ``spec.authOptions`` arrived in KubeRay v1.5.1, ``authOptions.enableK8sTokenAuth``
  in v1.6.0, a RayService's ``spec.upgradeStrategy`` in v1.3.0. An older operator runs the
  object without them: Ray without authentication, a RayService upgraded blue-green.
- Readiness: a RayCluster's ``status.state`` is ``ready``; a RayService has the condition
  ``Ready`` (KubeRay >= 1.3; older ones only set ``status.serviceStatus: Running``); a RayJob's
  ``status.jobDeploymentStatus`` is ``Running`` or ``Complete``.
- With ``authOptions.mode: token`` KubeRay sets ``RAY_AUTH_MODE=token`` on the Ray containers.
- KubeRay does not replace a RayCluster's pods when its spec changes: a new image reaches only
  the pods created after the change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.props import get
from policies.resources import cluster_spec, ray_kind, worker_groups
from raytpu.crds import object_schema, unknown_field_paths

HEAD_GROUP = "headgroup"
"""The ``ray.io/group`` label KubeRay gives the head pod."""
CRD_NAMES = {
    "RayCluster": "rayclusters.ray.io",
    "RayService": "rayservices.ray.io",
    "RayJob": "rayjobs.ray.io",
}
PLURALS = {kind: name.split(".")[0] for kind, name in CRD_NAMES.items()}
FIELD_SINCE: tuple[tuple[str, str, str], ...] = (
    ("v1.3.0", "rayservices.ray.io", "upgradeStrategy"),
    ("v1.5.1", "rayclusters.ray.io", "authOptions"),
    ("v1.6.0", "rayclusters.ray.io", "authOptions.enableK8sTokenAuth"),
)
"""(KubeRay release, CRD, spec field) for the fields this project sets that a KubeRay release
added (checked against KubeRay's tags), oldest first."""
AUTH_MODE_ENV = "RAY_AUTH_MODE"
READY_JOB_STATES = ("Running", "Complete")
LIVE_PODS = ("Pending", "Running")

CHECK_VERSION = "KubeRay version"
CHECK_WEBHOOK = "TPU webhook"
CHECK_READY = "Ray objects Ready"
CHECK_SLICES = "TPU slices"
CHECK_AUTH = "token auth"
CHECK_IMAGES = "RayCluster images"


@dataclass(frozen=True)
class Group:
    """One pod group of a declared Ray cluster: the head (``headgroup``) or a worker group."""

    name: str
    hosts: int
    """``numOfHosts``: pods per slice (1 for the head and for single-host groups)."""
    tpu: bool
    images: tuple[tuple[str, str], ...]
    """(container name, image) of its pod template."""


@dataclass(frozen=True)
class DeclaredRay:
    """One RayCluster, RayService or RayJob the stack declares."""

    kind: str
    name: str
    namespace: str
    spec: Mapping[str, Any] = field(hash=False)
    """The whole ``spec`` as declared: what the live CRD must know."""
    cluster: Mapping[str, Any] = field(hash=False)
    """Its Ray cluster spec (a RayService's ``rayClusterConfig``, a RayJob's
    ``rayClusterSpec``)."""
    groups: tuple[Group, ...]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"

    @property
    def auth_mode(self) -> str | None:
        mode = get(self.cluster, "authOptions.mode")
        return mode if isinstance(mode, str) else None


@dataclass(frozen=True)
class ClusterState:
    """What the Kubernetes API answered: the items of each ``kubectl get ... -o json``."""

    crds: tuple[Mapping[str, Any], ...]
    mutating_webhooks: tuple[Mapping[str, Any], ...]
    ray_objects: Mapping[str, tuple[Mapping[str, Any], ...]] = field(hash=False)
    """kind (``RayCluster``...) -> its objects."""
    pods: tuple[Mapping[str, Any], ...]
    nodes: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Row:
    check: str
    ok: bool
    message: str


def _images(template_spec: Any) -> tuple[tuple[str, str], ...]:
    containers = get(template_spec, "containers") or []
    return tuple(
        (str(c.get("name", "")), str(c.get("image", "")))
        for c in containers
        if isinstance(c, Mapping)
    )


def declared_objects(resources: Iterable[Any]) -> tuple[DeclaredRay, ...]:
    """The Ray objects among declared resources (``infra.offline.DeclaredResource``)."""
    found = []
    for resource in resources:
        kind = ray_kind(resource.type)
        if kind is None:
            continue
        props = resource.props
        _, spec = cluster_spec(props, kind) or ("", {})
        head = Group(HEAD_GROUP, 1, False, _images(get(spec, "headGroupSpec.template.spec")))
        workers = tuple(
            Group(str(g.name), int(g.hosts), g.requests_tpu, _images({"containers": g.containers}))
            for g in worker_groups(props, kind)
        )
        found.append(
            DeclaredRay(
                kind=kind,
                name=str(get(props, "metadata.name") or resource.name),
                namespace=str(get(props, "metadata.namespace") or "default"),
                spec=get(props, "spec") or {},
                cluster=spec if isinstance(spec, Mapping) else {},
                groups=(head, *workers),
            )
        )
    return tuple(found)


def live_object(state: ClusterState, declared: DeclaredRay) -> Mapping[str, Any] | None:
    for item in state.ray_objects.get(declared.kind, ()):
        meta = item.get("metadata") or {}
        if meta.get("name") == declared.name and meta.get("namespace") == declared.namespace:
            return item
    return None


def live_cluster_names(declared: DeclaredRay, live: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The RayClusters that run ``declared``: itself, a RayService's active and pending
    clusters (``status.*ServiceStatus.rayClusterName``), a RayJob's ``status.rayClusterName``."""
    if declared.kind == "RayCluster":
        return (declared.name,)
    if live is None:
        return ()
    paths = {
        "RayService": (
            "status.activeServiceStatus.rayClusterName",
            "status.pendingServiceStatus.rayClusterName",
        ),
        "RayJob": ("status.rayClusterName",),
    }[declared.kind]
    return tuple(name for path in paths if isinstance(name := get(live, path), str) and name)


def pods_of(state: ClusterState, namespace: str, cluster: str) -> list[Mapping[str, Any]]:
    """The live (Pending or Running, not terminating) pods of one RayCluster."""
    return [
        pod
        for pod in state.pods
        if (pod.get("metadata") or {}).get("namespace") == namespace
        and labels(pod).get("ray.io/cluster") == cluster
        and get(pod, "status.phase") in LIVE_PODS
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    ]


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def env_of(pod: Mapping[str, Any], name: str) -> str | None:
    """The value of env var ``name`` in the pod's first container that sets it."""
    for container in get(pod, "spec.containers") or []:
        for var in container.get("env") or []:
            if var.get("name") == name and "value" in var:
                return str(var["value"])
    return None


def _row(check: str, problems: Sequence[str], ok_message: str) -> Row:
    if problems:
        return Row(check, False, "; ".join(problems))
    return Row(check, True, ok_message)


# ------------------------------------------------------------------------- KubeRay version


def _crd(state: ClusterState, name: str) -> Mapping[str, Any] | None:
    return next((c for c in state.crds if (c.get("metadata") or {}).get("name") == name), None)


def _spec_schema(crd: Mapping[str, Any]) -> Any:
    return get(object_schema(dict(crd), "v1") or {}, "properties.spec")


def _since(path: str) -> str:
    field_path = path.split(".", 1)[-1].removeprefix("rayClusterConfig.")
    field_path = field_path.removeprefix("rayClusterSpec.")
    found = [version for version, _, name in FIELD_SINCE if name == field_path]
    return f" (KubeRay >= {found[0]})" if found else ""


def _has_field(state: ClusterState, crd_name: str, dotted: str) -> bool:
    crd = _crd(state, crd_name)
    schema = _spec_schema(crd) if crd else None
    path = ".".join(f"properties.{part}" for part in dotted.split("."))
    return isinstance(get(schema, path), Mapping)


def _version_floor(state: ClusterState) -> str:
    """The newest release of :data:`FIELD_SINCE` whose fields (and all older ones) the live
    CRDs know; empty when not even the oldest."""
    floor = ""
    for version, crd_name, dotted in FIELD_SINCE:
        if not _has_field(state, crd_name, dotted):
            break
        floor = version
    return floor


def check_version(declared: Sequence[DeclaredRay], state: ClusterState) -> Row:
    """Every field the stack's Ray objects set is in the live CRD of its kind."""
    problems = []
    for kind in sorted({d.kind for d in declared}):
        if _crd(state, CRD_NAMES[kind]) is None:
            problems.append(
                f"CRD {CRD_NAMES[kind]} is not installed: enable the GKE Ray Operator add-on "
                "(ray-tpu:cluster, pulumi up) or check that kubectl points at the stack's cluster"
            )
    for obj in declared:
        crd = _crd(state, CRD_NAMES[obj.kind])
        if crd is None:
            continue
        dropped = unknown_field_paths(dict(obj.spec), _spec_schema(crd))
        if dropped:
            fields = ", ".join(f"{path}{_since(path)}" for path in dropped)
            problems.append(
                f"{obj.label}: the live CRD {CRD_NAMES[obj.kind]} lacks {fields}, so the API "
                "server dropped it: the add-on's KubeRay is too old. Upgrade the cluster to a GKE "
                "version whose Ray add-on has it (the add-on's KubeRay follows the GKE version), "
                "then pulumi up again"
            )
    floor = _version_floor(state)
    known = f" (KubeRay >= {floor} by its schema)" if floor else ""
    return _row(CHECK_VERSION, problems, f"the live CRDs know every field the stack sets{known}")


# ------------------------------------------------------------------------------ TPU webhook


def _mutates_kuberay_pods(config: Mapping[str, Any]) -> bool:
    """A webhook of ``config`` mutates CREATE of core pods, for KubeRay's pods (its object
    selector ``app.kubernetes.io/name: kuberay``) or by its name (``tpu``)."""
    config_name = str((config.get("metadata") or {}).get("name", ""))
    for hook in config.get("webhooks") or []:
        on_pod_create = any(
            "" in (rule.get("apiGroups") or [])
            and {"pods", "*"} & set(rule.get("resources") or [])
            and {"CREATE", "*"} & set(rule.get("operations") or [])
            for rule in hook.get("rules") or []
        )
        selector = get(hook, "objectSelector.matchLabels") or {}
        for_kuberay = selector.get("app.kubernetes.io/name") == "kuberay"
        named_tpu = "tpu" in f"{config_name} {hook.get('name', '')}".lower()
        if on_pod_create and (for_kuberay or named_tpu):
            return True
    return False


def check_webhook(declared: Sequence[DeclaredRay], state: ClusterState) -> Row:
    """The TPU webhook (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES, hostnames) is installed."""
    if not any(g.tpu for d in declared for g in d.groups):
        return Row(CHECK_WEBHOOK, True, "no declared worker group requests google.com/tpu")
    found = [c for c in state.mutating_webhooks if _mutates_kuberay_pods(c)]
    if found:
        names = ", ".join(str((c.get("metadata") or {}).get("name")) for c in found)
        return Row(CHECK_WEBHOOK, True, f"mutating webhook on KubeRay's pods: {names}")
    return Row(
        CHECK_WEBHOOK,
        False,
        "no mutating webhook for KubeRay's TPU pods: new TPU pods get no TPU_WORKER_ID, "
        "TPU_NAME or TPU_WORKER_HOSTNAMES and multi-host JAX hangs at start-up. Enable the GKE "
        "Ray Operator add-on (it hosts the TPU webhook), check `kubectl get "
        "mutatingwebhookconfigurations`, then delete the TPU pods created without it",
    )


# ------------------------------------------------------------------------------- readiness


def _condition(live: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in get(live, "status.conditions") or [] if c.get("type") == kind), None)


def _not_ready(obj: DeclaredRay, live: Mapping[str, Any]) -> str | None:
    """Why ``live`` is not Ready, or None when it is."""
    if obj.kind == "RayCluster":
        state = get(live, "status.state")
        if state == "ready":
            return None
        reason = get(live, "status.reason")
        return f"status.state is {state!r}" + (f" ({reason})" if reason else "")
    if obj.kind == "RayService":
        ready = _condition(live, "Ready")
        if ready is not None:
            if ready.get("status") == "True":
                return None
            return f"condition Ready is {ready.get('status')} ({ready.get('reason', '')})"
        status = get(live, "status.serviceStatus")
        return None if status == "Running" else f"status.serviceStatus is {status!r}"
    status = get(live, "status.jobDeploymentStatus")
    if status in READY_JOB_STATES:
        return None
    message = get(live, "status.message")
    return f"status.jobDeploymentStatus is {status!r}" + (f": {message}" if message else "")


def check_ready(declared: Sequence[DeclaredRay], state: ClusterState) -> Row:
    problems = []
    for obj in declared:
        live = live_object(state, obj)
        plural = PLURALS[obj.kind]
        if live is None:
            problems.append(
                f"{obj.label} does not exist: did pulumi up create it? (kubectl get {plural} "
                f"-n {obj.namespace})"
            )
            continue
        why = _not_ready(obj, live)
        if why:
            problems.append(
                f"{obj.label} is not Ready: {why}; see `kubectl describe {plural} {obj.name} -n "
                f"{obj.namespace}` and its pods' events (a Pending TPU pod: no capacity)"
            )
    names = ", ".join(d.label for d in declared)
    return _row(CHECK_READY, problems, f"{len(declared)} Ready: {names}")


# ------------------------------------------------------------------------------ token auth


def _auth_problems(obj: DeclaredRay, state: ClusterState) -> list[str]:
    live = live_object(state, obj)
    if live is None:
        return []  # the Ready row says it is missing
    path = {
        "RayCluster": "spec",
        "RayService": "spec.rayClusterConfig",
        "RayJob": "spec.rayClusterSpec",
    }[obj.kind]
    if get(live, f"{path}.authOptions.mode") != "token":
        return [
            f"{obj.label}: the live object has no authOptions.mode token (declared: "
            f"{obj.auth_mode}): Ray runs without authentication and anyone who reaches its "
            "head runs code. An old KubeRay drops the field (see the KubeRay version row): "
            "upgrade, then pulumi up"
        ]
    problems = []
    for cluster in live_cluster_names(obj, live):
        for pod in pods_of(state, obj.namespace, cluster):
            if labels(pod).get("ray.io/group") == HEAD_GROUP and env_of(pod, AUTH_MODE_ENV) != (
                "token"
            ):
                problems.append(
                    f"{obj.label}: head pod {pod_name(pod)} runs without {AUTH_MODE_ENV}=token "
                    f"(made before token auth was on): delete it (kubectl delete pod "
                    f"{pod_name(pod)} -n {obj.namespace}) and KubeRay recreates it with auth"
                )
    return problems


def check_auth(declared: Sequence[DeclaredRay], state: ClusterState) -> Row:
    problems = [
        f"{obj.label} is declared without authOptions.mode token: set it (the policy pack "
        "requires it) and pulumi up"
        for obj in declared
        if obj.auth_mode != "token"
    ]
    for obj in declared:
        if obj.auth_mode == "token":
            problems += _auth_problems(obj, state)
    return _row(CHECK_AUTH, problems, "authOptions.mode token on every Ray object and its head")


# ---------------------------------------------------------------------------- stale images


def _stale(obj: DeclaredRay, pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(running image, declared image) of each container of ``pod`` that differs."""
    group = next((g for g in obj.groups if g.name == labels(pod).get("ray.io/group")), None)
    if group is None:
        return []
    running = {c.get("name"): c.get("image") for c in get(pod, "spec.containers") or []}
    return [
        (str(running[name]), image)
        for name, image in group.images
        if name in running and running[name] != image
    ]


def _serving_cluster(obj: DeclaredRay, state: ClusterState) -> str | None:
    """The RayCluster whose pods should run ``obj``'s declared image now: a RayCluster itself;
    a RayService's active cluster while no upgrade is pending (a pending cluster is KubeRay's
    blue-green upgrade under way: the active one keeps the old image until the switch)."""
    if obj.kind == "RayCluster":
        return obj.name
    live = live_object(state, obj)
    if live is None or get(live, "status.pendingServiceStatus.rayClusterName"):
        return None
    return next(iter(live_cluster_names(obj, live)), None)


def _stale_fix(obj: DeclaredRay, cluster: str) -> str:
    if obj.kind == "RayCluster":
        return (
            "KubeRay does not replace a RayCluster's pods when its spec changes. When no job runs "
            f"on it, delete its pods (kubectl delete pod -n {obj.namespace} -l "
            f"ray.io/cluster={cluster}); KubeRay recreates them with the declared image"
        )
    return (
        "with upgradeStrategy None KubeRay applies Serve config changes in place but does not "
        "replace the RayService's cluster for a new image. Delete the active cluster (kubectl "
        f"delete raycluster -n {obj.namespace} {cluster}); KubeRay recreates it from the "
        "declared spec, with downtime while its slice comes back"
    )


def check_images(declared: Sequence[DeclaredRay], state: ClusterState) -> Row:
    """RayClusters, and RayServices' active clusters, whose pods run another image than
    declared: KubeRay rolls neither in place."""
    problems = []
    checked = [d for d in declared if d.kind in ("RayCluster", "RayService")]
    for obj in checked:
        cluster = _serving_cluster(obj, state)
        if cluster is None:
            continue
        stale: dict[tuple[str, str], list[str]] = {}
        for pod in pods_of(state, obj.namespace, cluster):
            for pair in _stale(obj, pod):
                stale.setdefault(pair, []).append(pod_name(pod))
        if stale:
            shown = "; ".join(
                f"{', '.join(sorted(set(pods)))} run {old}, declared {new}"
                for (old, new), pods in stale.items()
            )
            problems.append(f"{obj.label} is stale ({shown}): {_stale_fix(obj, cluster)}")
    names = ", ".join(d.label for d in checked) or "no RayCluster or RayService declared"
    return _row(CHECK_IMAGES, problems, f"pods run the declared image: {names}")
