"""The stack's Artifact Registry repository for the worker image built from ``Dockerfile``.

One ``DOCKER`` repository in ``gcp:region`` (``REGION-docker.pkg.dev/PROJECT/REPOSITORY``); the
nodes' service account (``cluster.nodeServiceAccount``, else the project's Compute Engine default
service account) may read it, so kubelets pull the image without any pull secret. The deploy
workflow creates it first (``pulumi up --target`` this repository), pushes the image, then runs
the whole ``pulumi up``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_gcp as gcp

READER_ROLE = "roles/artifactregistry.reader"


def default_node_account(project_number: str) -> str:
    """The Compute Engine default service account GKE nodes run as when none is named."""
    return f"{project_number}-compute@developer.gserviceaccount.com"


@dataclass(frozen=True)
class ImageRegistryArgs:
    project: str
    region: str
    repository: str
    node_service_account: str | None = None


class ImageRegistry(pulumi.ComponentResource):
    """Outputs: ``url`` (``REGION-docker.pkg.dev/PROJECT/REPOSITORY``) and ``repository``."""

    def __init__(
        self, name: str, args: ImageRegistryArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("ray-tpu:infra:ImageRegistry", name, None, opts)
        self.repository = gcp.artifactregistry.Repository(
            f"{name}-repository",
            repository_id=args.repository,
            project=args.project,
            location=args.region,
            format="DOCKER",
            description="ray-tpu worker images (Dockerfile): Ray + jax[tpu] + this project",
            labels={"managed-by": "pulumi", "part-of": "ray-tpu"},
            opts=pulumi.ResourceOptions(parent=self),
        )
        if args.node_service_account:
            account: pulumi.Input[str] = args.node_service_account
        else:
            account = gcp.organizations.get_project_output(
                project_id=args.project, opts=pulumi.InvokeOutputOptions(parent=self)
            ).number.apply(lambda n: default_node_account(str(n)))
        self.node_reader = gcp.artifactregistry.RepositoryIamMember(
            f"{name}-node-reader",
            project=args.project,
            location=args.region,
            repository=self.repository.repository_id,
            role=READER_ROLE,
            member=pulumi.Output.from_input(account).apply(lambda a: f"serviceAccount:{a}"),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.url = f"{args.region}-docker.pkg.dev/{args.project}/{args.repository}"
        self.register_outputs({"url": self.url})
