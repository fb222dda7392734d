"""A KubeRay ``RayJob`` on a TPU slice, as a Kubernetes custom resource.

The spec comes from :func:`infra.rayjob_spec.ray_job_spec`: the training entrypoint sized to the
slice, ``shutdownAfterJobFinishes`` with a TTL, ``K8sJobMode``, and a ``rayClusterSpec`` built by
:func:`infra.kuberay.ray_cluster_spec` from the same catalog record as the slice's node pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra import custom_resource, rayjob_spec
from infra.config import RayJobConfig, StackConfig


@dataclass(frozen=True)
class RayJobArgs:
    stack: StackConfig
    job: RayJobConfig
    provider: k8s.Provider
    stack_name: str = ""
    depends_on: Sequence[pulumi.Resource] = field(default_factory=tuple)


class RayJob(pulumi.ComponentResource):
    """Outputs: ``name``, ``namespace``, ``entrypoint``."""

    def __init__(
        self, name: str, args: RayJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:RayJob", name, None, opts)
        manifest = rayjob_spec.ray_job_object(args.stack, args.job, stack_name=args.stack_name)
        self.resource = custom_resource.declare(
            name,
            manifest,
            pulumi.ResourceOptions(
                parent=self,
                provider=args.provider,
                depends_on=list(args.depends_on),
                # KubeRay deletes the job's RayCluster after the TTL; the RayJob object stays
                # (status Complete) until Pulumi deletes it. A changed spec is a new run, and
                # the name is fixed: delete the old RayJob first, never patch a running one.
                delete_before_replace=True,
            ),
        )
        self.name = args.job.name
        self.namespace = args.job.namespace
        self.entrypoint = manifest["spec"]["entrypoint"]
        self.register_outputs(
            {"name": self.name, "namespace": self.namespace, "entrypoint": self.entrypoint}
        )
