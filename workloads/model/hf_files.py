"""Where a Hugging Face folder's files come from and go (:mod:`workloads.model.hf_llama`): a
local folder as it is; a ``gs://`` one through gcsfs (the one native client of
:mod:`workloads.storage`), each file downloaded once into a local cache (``$RAYTPU_HF_CACHE``)
and kept while the object's generation is the same; an export to ``gs://`` staged locally and
uploaded by the writing process.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from raytpu.errors import invalid
from workloads.model.hf_weights import Tensor
from workloads.storage import is_remote, join

CACHE_ENV = "RAYTPU_HF_CACHE"
"""The local cache of ``gs://`` folders' files (default ``~/.cache/raytpu/hf``)."""
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}
"""Export dtypes and their safetensors names."""


def last_part(folder: str) -> str:
    if is_remote(folder):
        return folder.rstrip("/").rsplit("/", 1)[-1]
    return Path(folder).absolute().name


def cache_root() -> Path:
    """Where ``gs://`` folders' files are downloaded (``$RAYTPU_HF_CACHE``)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "raytpu" / "hf")


def gcs() -> Any:
    import gcsfs

    from workloads.storage import quiet_clients

    quiet_clients()
    return gcsfs.GCSFileSystem()


def fetch(folder: str, name: str, *, required: bool = False) -> Path | None:
    """The local path of ``folder/name``; for ``gs://``, downloaded into the cache unless the
    cached copy has the object's generation. None (or, if ``required``, an error naming the
    file) where it is absent."""
    if not is_remote(folder):
        path = Path(folder, name)
        if path.is_file():
            return path
        if required:
            raise FileNotFoundError(
                invalid("folder", folder, f"a Hugging Face folder with {name}", reason=f"no {path}")
            )
        return None
    from raytpu.gcs_names import check_gs_path

    check_gs_path("folder", folder)
    fs, remote = gcs(), join(folder, name).removeprefix("gs://")
    if not fs.exists(remote):
        if required:
            raise FileNotFoundError(
                invalid(
                    "folder",
                    folder,
                    f"a Hugging Face folder with {name}",
                    reason=f"no gs://{remote}",
                )
            )
        return None
    info = fs.info(remote)
    version = str(info.get("generation") or info.get("md5Hash") or info.get("size"))
    local, stamp = cache_root() / remote, cache_root() / f"{remote}.version"
    if local.is_file() and stamp.is_file() and stamp.read_text() == version:
        return local
    local.parent.mkdir(parents=True, exist_ok=True)
    partial = local.with_name(f".{local.name}.{os.getpid()}.part")
    fs.get(remote, str(partial))
    os.replace(partial, local)
    stamp.write_text(version)
    return local


@contextmanager
def target(folder: str, writer: bool) -> Iterator[Path]:
    """A local folder to write into: ``folder`` itself, or for ``gs://`` a temporary one
    uploaded to it at the end (by the writing process)."""
    if not is_remote(folder):
        path = Path(folder)
        if writer:
            path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    from raytpu.gcs_names import check_gs_path

    check_gs_path("folder", folder)
    staging = Path(tempfile.mkdtemp(prefix="raytpu-hf-export-"))
    try:
        yield staging
        if writer:
            fs = gcs()
            for path in sorted(staging.iterdir()):
                fs.put(str(path), join(folder, path.name).removeprefix("gs://"))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def shard_plan(rows: list[Tensor], itemsize: int, max_shard_bytes: int) -> list[list[Tensor]]:
    """Rows grouped, in order, into files of at most ``max_shard_bytes`` (a tensor larger than
    that gets a file of its own)."""
    shards: list[list[Tensor]] = [[]]
    size = 0
    for row in rows:
        nbytes = int(np.prod(row.shape)) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(row)
        size += nbytes
    return shards


def write_safetensors(
    path: Path, entries: list[tuple[str, tuple[int, ...]]], dtype: str, arrays: Iterator[Any]
) -> None:
    """A safetensors file (metadata ``{"format": "pt"}``) written one tensor at a time:
    ``entries`` (key, shape) in order, ``arrays`` yielding each tensor as it is gathered."""
    itemsize = np.dtype(numpy_dtype(dtype)).itemsize
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key, shape in entries:
        end = offset + int(np.prod(shape)) * itemsize
        header[key] = {"dtype": DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with path.open("wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for (key, shape), array in zip(entries, arrays, strict=True):
            data = np.ascontiguousarray(np.asarray(array, dtype=numpy_dtype(dtype)))
            if data.shape != tuple(shape):
                raise ValueError(invalid(key, f"shape {data.shape}", f"shape {tuple(shape)}"))
            out.write(data.tobytes())


def numpy_dtype(dtype: str) -> Any:
    if dtype not in DTYPES:
        raise ValueError(invalid("dtype", dtype, list(DTYPES)))
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)
