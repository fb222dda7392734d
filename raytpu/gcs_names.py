"""GCS bucket names: the one rule the stack's ``ray-tpu:storage.bucket`` and every ``gs://`` path
a workload is given are checked against (stdlib only).

GCS's own rule for names without dots: 3 to 63 characters of lowercase letters, digits, ``-`` and
``_``, starting and ending with a letter or digit, and no ``goog`` in them. A ``gs://`` path whose
bucket breaks it fails only when the first checkpoint is written (tensorstore: "Invalid GCS bucket
name"), after the slices were reserved and every host started; checked here, it fails before.
"""

from __future__ import annotations

import re
from typing import Any

from raytpu.errors import invalid

BUCKET_RE = re.compile(r"^[a-z0-9][-a-z0-9_]{1,61}[a-z0-9]$")
BUCKET_VALID = (
    "3..63 lowercase letters, digits, '-' and '_', starting and ending with a letter or digit, "
    "without 'goog' (bucket names are global: include your project)"
)


def bucket_ok(name: Any) -> bool:
    return isinstance(name, str) and bool(BUCKET_RE.match(name)) and "goog" not in name


def check_gs_path(field: str, path: str) -> None:
    """``ValueError`` naming ``field`` when ``path`` is ``gs://BUCKET[/...]`` with a bad bucket."""
    if not path.startswith("gs://"):
        return
    bucket = path.removeprefix("gs://").split("/", 1)[0]
    if not bucket_ok(bucket):
        raise ValueError(
            invalid(field, path, f"gs://BUCKET/PATH with BUCKET {BUCKET_VALID}",
                    reason=f"bucket {bucket!r} is not a GCS bucket name")
        )  # fmt: skip
