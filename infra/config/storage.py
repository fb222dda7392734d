"""``ray-tpu:storage``: the checkpoint bucket of the stack and the Ray pods' identity.

Every key has a default, so a stack without the section gets a bucket named after its project
and cluster, kept 30 days, and a Kubernetes ServiceAccount ``ray-tpu`` for its Ray pods."""

from __future__ import annotations

import re
from typing import Any

from infra.config.reader import Problems, Section, int_range, name_check, name_valid
from infra.config.schema import NAMESPACE, StorageConfig
from raytpu.gcs_names import BUCKET_VALID, bucket_ok

_KEYS = (
    "bucket",
    "location",
    "deleteAfterDays",
    "softDeleteDays",
    "forceDestroy",
    "serviceAccount",
)
SOFT_DELETE_MAX_DAYS = 90
"""GCS soft delete: 0 (off) or 7..90 days."""


def default_bucket(project: str, cluster: str) -> str:
    """``<project>-<cluster>-ckpt`` (``<cluster>-ckpt`` when the cluster is named after the
    project), cut to GCS's 63 characters."""
    base = cluster if cluster.startswith(project) else f"{project}-{cluster}"
    return f"{base[:58].rstrip('-_')}-ckpt"


def parse_storage(
    problems: Problems, raw: Any, project: str | None, region: str | None, cluster: str | None
) -> StorageConfig | None:
    s = Section(problems, f"{NAMESPACE}:storage", raw if raw is not None else {}, _KEYS)
    default = default_bucket(project, cluster) if project and cluster else "checkpoints-bucket-name"
    bucket = s.get("bucket", str, default, valid=BUCKET_VALID, check=bucket_ok)
    location = s.get(
        "location",
        str,
        region or "",
        valid="a GCS location: the region of the slices (default gcp:region), e.g. us-east5",
        check=lambda v: bool(re.match(r"^[a-z]+(-[a-z]+[0-9]+)?$", v.lower())),
    )
    delete_after = s.get(
        "deleteAfterDays",
        int,
        30,
        valid="an integer 1..3650: days after which a checkpoint object is deleted",
        check=int_range(1, 3650),
    )
    high = SOFT_DELETE_MAX_DAYS
    soft_delete = s.get(
        "softDeleteDays",
        int,
        7,
        valid=f"0 (off) or an integer 7..{high}: days a deleted object stays restorable",
        check=lambda v: v == 0 or 7 <= v <= high,
    )
    force_destroy = s.get(
        "forceDestroy",
        bool,
        False,
        valid="true or false (true: `pulumi destroy` deletes the checkpoints with the bucket)",
    )
    account = s.get(
        "serviceAccount",
        str,
        "ray-tpu",
        valid=f"a Kubernetes ServiceAccount name: {name_valid(63)}",
        check=name_check(63),
    )
    values = (bucket, location, delete_after, soft_delete, force_destroy, account)
    if None in values or not s.ok:
        return None
    return StorageConfig(
        bucket=bucket,
        location=location,
        delete_after_days=delete_after,
        soft_delete_days=soft_delete,
        force_destroy=force_destroy,
        service_account=account,
    )
