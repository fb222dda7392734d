"""The three KubeRay kinds as one table: how each is read from config, built and exported.

Pure (no pulumi import): the program (:mod:`infra.program`) declares one
:class:`infra.components.ray_object.RayObject` per configured object of every kind in :data:`RAY_KINDS`, and
exports each kind's stack outputs under its config key. The stack config parser reads the same
keys (:data:`infra.config.ray_objects.SECTIONS`).

Glossary (KubeRay's words): a **RayCluster** is a Ray head plus worker groups; a **RayService**
serves a Ray Serve application on a RayCluster it manages; a **RayJob** runs one entrypoint on a
RayCluster it creates and deletes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.config.schema import RayClusterConfig, RayJobConfig, RayServiceConfig, StackConfig
from infra.manifests import kuberay
from infra.manifests import rayjob as rayjob_spec
from raytpu.ray_names import DASHBOARD_PORT

RayObjectConfig = RayClusterConfig | RayServiceConfig | RayJobConfig
Manifest = dict[str, Any]


@dataclass(frozen=True)
class RayKind:
    """One KubeRay kind: its config section, its manifest builder and its stack outputs."""

    kind: str
    """``RayCluster``, ``RayService`` or ``RayJob`` (also the component's type token suffix)."""
    config_key: str
    """Key under ``ray-tpu:`` in the stack file, and the stack output with these objects."""
    resource_prefix: str
    """Pulumi resource name prefix: ``<prefix>-<name>``."""
    objects: Callable[[StackConfig], tuple[RayObjectConfig, ...]]
    build: Callable[[StackConfig, Any, str], Manifest]
    """``(stack, object config, stack name) -> manifest`` (apiVersion, kind, metadata, spec)."""
    outputs: Callable[[Any, Manifest], Mapping[str, Any]]
    """The stack output of one object, as :mod:`raytpu.stack_outputs` reads it."""
    ignore_changes: tuple[str, ...] = ()
    """Inputs of the custom resource a later ``pulumi up`` leaves alone once it exists."""
    retain_on_delete: bool = False
    """Whether Pulumi leaves the object in the cluster when it drops it (replaced or removed)."""


def _auth_outputs(manifest: Manifest) -> dict[str, Any]:
    """How a client authenticates (never the token): ``auth`` and the token Secret's name."""
    spec = manifest["spec"]
    cluster = spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or spec
    options = cluster.get("authOptions") or {}
    if options.get("mode") != "token":
        return {"auth": "none"}
    if options.get("enableK8sTokenAuth"):
        return {"auth": "kubernetes"}
    return {"auth": "secret", "authSecret": options["secretName"]}


def _head_outputs(obj: RayObjectConfig, manifest: Manifest) -> dict[str, Any]:
    return {
        "namespace": obj.namespace,
        "slice": obj.slice,
        "headService": kuberay.head_service_name(obj.name),
        "dashboardPort": DASHBOARD_PORT,
        **_auth_outputs(manifest),
    }


def _service_outputs(obj: RayServiceConfig, manifest: Manifest) -> dict[str, Any]:
    return {**_head_outputs(obj, manifest), "serveService": kuberay.serve_service_name(obj.name)}


def _job_outputs(obj: RayJobConfig, manifest: Manifest) -> dict[str, Any]:
    return {
        "namespace": obj.namespace,
        "slice": obj.slice,
        "run": manifest["metadata"]["name"],
        "entrypoint": entrypoint(manifest),
        **_auth_outputs(manifest),
    }


def entrypoint(manifest: Manifest) -> str:
    """A RayJob manifest's entrypoint command."""
    return manifest["spec"]["entrypoint"]


RAY_KINDS: tuple[RayKind, ...] = (
    RayKind(
        kind="RayCluster",
        config_key="rayClusters",
        resource_prefix="raycluster",
        objects=lambda stack: stack.ray_clusters,
        build=kuberay.ray_cluster_object,
        outputs=_head_outputs,
    ),
    RayKind(
        kind="RayService",
        config_key="rayServices",
        resource_prefix="rayservice",
        objects=lambda stack: stack.ray_services,
        build=kuberay.ray_service_object,
        outputs=_service_outputs,
    ),
    RayKind(
        kind="RayJob",
        config_key="rayJobs",
        resource_prefix="rayjob",
        objects=lambda stack: stack.ray_jobs,
        build=lambda stack, obj, stack_name: rayjob_spec.ray_job_object(
            stack, obj, stack_name=stack_name
        ),
        outputs=_job_outputs,
        # A job runs what it was created with (the name carries a digest of it: run_name): a
        # deploy that only bumps the image changes nothing, a changed job is a new RayJob, and
        # the old one is left to finish (KubeRay deletes its RayCluster after the TTL; delete
        # the finished RayJob object with kubectl: docs/infra.md#deploys-and-tpu-capacity).
        ignore_changes=("spec",),
        retain_on_delete=True,
    ),
)
"""Every KubeRay kind the program declares, in declaration order."""


def manifests(stack: StackConfig, stack_name: str = "") -> list[Manifest]:
    """Every KubeRay manifest ``stack`` declares (for validation and tests)."""
    return [kind.build(stack, obj, stack_name) for kind in RAY_KINDS for obj in kind.objects(stack)]
