"""The stack's checkpoint bucket and the identity Ray pods reach it with.

- a GCS bucket: uniform bucket-level access, public access prevention enforced, soft delete
  (deleted objects stay restorable ``softDeleteDays``), and a lifecycle rule that deletes objects
  older than ``deleteAfterDays`` (old runs' checkpoints);
- in every namespace with Ray objects, a Kubernetes ServiceAccount (``storage.serviceAccount``)
  that every Ray pod runs as (``serviceAccountName``, :mod:`infra.manifests.kuberay`);
- one bucket-level IAM member per ServiceAccount: ``roles/storage.objectUser`` (create, read,
  list, delete objects) on this bucket only, granted to the ServiceAccount itself through
  Workload Identity Federation for GKE's principal
  ``principal://iam.googleapis.com/projects/NUMBER/locations/global/workloadIdentityPools/
  PROJECT.svc.id.goog/subject/ns/NAMESPACE/sa/NAME`` (no Google service account, no key, no
  annotation: docs/infra.md, "Storage and identity").

Training run ``N`` writes ``gs://BUCKET/N``; a RayService serves ``gs://BUCKET/<checkpointRun>``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp
import pulumi_kubernetes as k8s

from infra.config.schema import StorageConfig

OBJECT_ROLE = "roles/storage.objectUser"
"""Object create/read/list/delete (and multipart uploads) on the bucket; nothing on the bucket
itself or on the project."""
SECONDS_PER_DAY = 86_400


def principal(project_number: str, project: str, namespace: str, account: str) -> str:
    """The IAM principal of Kubernetes ServiceAccount ``namespace/account`` of the cluster's
    workload pool ``PROJECT.svc.id.goog`` (Workload Identity Federation for GKE)."""
    return (
        f"principal://iam.googleapis.com/projects/{project_number}/locations/global/"
        f"workloadIdentityPools/{project}.svc.id.goog/subject/ns/{namespace}/sa/{account}"
    )


@dataclass(frozen=True)
class CheckpointStorageArgs:
    project: str
    storage: StorageConfig
    provider: k8s.Provider
    namespaces: Sequence[str]
    """Namespaces with Ray objects: each gets the ServiceAccount."""
    namespace_resources: Mapping[str, pulumi.Resource] = field(default_factory=dict)
    """Namespaces the program creates (the ServiceAccount waits for its namespace)."""
    cluster: pulumi.Resource | None = None
    """The GKE cluster: its workload pool must exist before a principal of it is granted."""


class CheckpointStorage(pulumi.ComponentResource):
    """Outputs: ``bucket_name``, ``service_accounts`` (namespace -> ServiceAccount)."""

    def __init__(
        self, name: str, args: CheckpointStorageArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:CheckpointStorage", name, None, opts)
        cfg = args.storage
        self.bucket = gcp.storage.Bucket(
            f"{name}-bucket",
            name=cfg.bucket,
            project=args.project,
            location=cfg.location.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(
                retention_duration_seconds=cfg.soft_delete_days * SECONDS_PER_DAY
            ),
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                        age=cfg.delete_after_days
                    ),
                )
            ],
            force_destroy=cfg.force_destroy,
            labels={"managed-by": "pulumi", "part-of": "ray-tpu"},
            opts=pulumi.ResourceOptions(parent=self),
        )
        number = gcp.organizations.get_project_output(
            project_id=args.project, opts=pulumi.InvokeOutputOptions(parent=self)
        ).number
        self.service_accounts: dict[str, k8s.core.v1.ServiceAccount] = {}
        self.members: dict[str, gcp.storage.BucketIAMMember] = {}
        for namespace in dict.fromkeys(args.namespaces):
            waits = (
                [args.namespace_resources[namespace]]
                if namespace in args.namespace_resources
                else []
            )
            self.service_accounts[namespace] = k8s.core.v1.ServiceAccount(
                f"{name}-ksa-{namespace}",
                metadata={
                    "name": cfg.service_account,
                    "namespace": namespace,
                    "labels": {"app.kubernetes.io/part-of": "ray-tpu"},
                },
                # The token stays mounted: with Kubernetes-RBAC Ray auth the pods present it to
                # their head (ray:write is bound to this ServiceAccount: infra/manifests/ray_access.py).
                opts=pulumi.ResourceOptions(parent=self, provider=args.provider, depends_on=waits),
            )
            self.members[namespace] = gcp.storage.BucketIAMMember(
                f"{name}-objects-{namespace}",
                bucket=self.bucket.name,
                role=OBJECT_ROLE,
                member=number.apply(
                    lambda n, ns=namespace: principal(str(n), args.project, ns, cfg.service_account)
                ),
                opts=pulumi.ResourceOptions(
                    parent=self, depends_on=[args.cluster] if args.cluster else []
                ),
            )
        self.bucket_name = self.bucket.name
        self.register_outputs({"bucketName": self.bucket_name})
