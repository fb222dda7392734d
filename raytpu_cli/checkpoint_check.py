"""What a checkpoint directory holds, read before anything starts.

Glossary (Orbax's): a **checkpoint directory** is one ``CheckpointManager`` root holding one
numbered folder per saved **step**; each step's ``meta/metadata`` is the JSON the trainer saved
with it (the step and the model family, :meth:`workloads.model.family.ModelFamily.to_dict`). A
**run** is one checkpoint directory; the runs of a bucket are its folders that hold steps.

``raytpu serve`` refuses a directory with no step, or whose model is not the ``--preset`` asked
for, and names the runs that do exist; ``raytpu train`` refuses to resume a run of another model.
Local folders are read with fsspec's local filesystem, ``gs://`` with gcsfs's plain JSON-API
client (the emulator's too, where ``STORAGE_EMULATOR_HOST`` points at it).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from dataclasses import dataclass
from typing import Any

from raytpu.errors import invalid
from raytpu_cli.common import UsageError

LIST_TIMEOUT_S = 10.0
"""Each request to the object store; a listing that takes longer is refused as unreadable."""
MAX_RUNS_SHOWN = 8
MAX_FOLDERS_PROBED = 200
"""Beside a path with no checkpoint, this many folders are looked into for runs, at most."""


@dataclass(frozen=True)
class Checkpoints:
    """The steps of one checkpoint directory and the meta of its latest step."""

    directory: str
    steps: tuple[int, ...]
    meta: dict[str, Any] | None

    @property
    def latest(self) -> int | None:
        return self.steps[-1] if self.steps else None

    @property
    def model(self) -> str:
        """``byte-lm`` or the preset's name, as ``--preset`` spells it (``""``: no checkpoint)."""
        if self.meta is None:
            return ""
        if self.meta.get("family", "byte-lm") == "byte-lm":
            return "byte-lm"
        return str((self.meta.get("model") or {}).get("name", self.meta.get("family")))


def filesystem(directory: str) -> Any:
    """The fsspec filesystem that reads ``directory``: local, or gcsfs for ``gs://``."""
    if directory.startswith("gs://"):
        with warnings.catch_warnings():  # google.api_core's notice of Python 3.11's end of life
            warnings.simplefilter("ignore", FutureWarning)
            import gcsfs.core

        from workloads.storage import quiet_clients

        quiet_clients()
        emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
        return gcsfs.core.GCSFileSystem(
            token="anon" if emulated else None,
            skip_instance_cache=True,
            use_listings_cache=False,
            requests_timeout=LIST_TIMEOUT_S,
            retries=1,
        )
    if "://" in directory:
        raise UsageError(
            invalid("--checkpoint-dir", directory, "a local folder or gs://BUCKET/PATH")
        )
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem()


def read_checkpoints(directory: str, fs: Any) -> Checkpoints:
    """The steps under ``directory`` (none if it does not exist) and the latest one's meta."""
    root = directory.rstrip("/")
    steps = tuple(sorted(_step_folders(fs, root)))
    meta = None
    if steps:
        # A checkpoint saved without a meta is the byte LM's older layout.
        with contextlib.suppress(FileNotFoundError, ValueError):
            meta = json.loads(fs.cat_file(f"{root}/{steps[-1]}/meta/metadata"))
        meta = meta or {"family": "byte-lm"}
    return Checkpoints(directory=directory, steps=steps, meta=meta)


def runs_in_bucket(directory: str, fs: Any) -> list[str]:
    """The checkpoint directories beside ``directory``: the folders of its parent (of its
    bucket, for ``gs://BUCKET/NAME``) that hold at least one step."""
    root = directory.rstrip("/")
    parent = root.rsplit("/", 1)[0] if "/" in root.removeprefix("gs://") else root
    prefix = "gs://" if directory.startswith("gs://") else ""
    runs = []
    for entry in _folders(fs, parent)[:MAX_FOLDERS_PROBED]:
        candidate = prefix + entry.removeprefix("gs://")
        if candidate.rstrip("/") != root and _step_folders(fs, candidate):
            runs.append(candidate)
        if len(runs) > MAX_RUNS_SHOWN:
            break
    return sorted(runs)


def check_servable(flag: str, directory: str, preset: str | None, fs: Any) -> Checkpoints:
    """``directory`` holds a checkpoint (of ``preset``, when given); else a UsageError naming
    the runs beside it."""
    found = _read(flag, directory, fs)
    if found.latest is None:
        problem = "holds no checkpoint"
        if not directory.startswith("gs://") and not fs.exists(directory):
            problem = "does not exist"
        raise UsageError(
            f"{flag}: {directory!r} {problem}; valid: {_runs_text(directory, fs)}; "
            "run `raytpu train --checkpoint-dir` with this path first"
        )
    if preset is not None and found.model != preset:
        raise UsageError(
            invalid(
                "--preset",
                preset,
                [found.model],
                f"{directory} holds a {found.model} checkpoint (step {found.latest})",
            )
        )
    return found


def check_resumable(flag: str, directory: str, preset: str | None, fs: Any) -> Checkpoints:
    """Training resumes from ``directory``'s latest step: it must be of the model trained now
    (``preset``; ``None``: the byte LM). An empty or missing directory starts from scratch."""
    found = _read(flag, directory, fs)
    wanted = preset or "byte-lm"
    if found.latest is None or found.model == wanted:
        return found
    held = f"{directory} holds a {found.model} checkpoint (step {found.latest})"
    option = "no --preset" if found.model == "byte-lm" else f"--preset {found.model}"
    if preset is None:
        raise UsageError(
            invalid(
                flag,
                directory,
                f"{option} to resume it, or another --checkpoint-dir",
                reason=f"for the byte LM: {held}",
            )
        )
    raise UsageError(
        invalid("--preset", preset, [option], f"{held}; or train into another --checkpoint-dir")
    )


def _read(flag: str, directory: str, fs: Any) -> Checkpoints:
    try:
        return read_checkpoints(directory, fs)
    except PermissionError as error:
        raise UsageError(f"{flag}: {directory!r} cannot be read ({error})") from None
    except (OSError, TimeoutError) as error:
        raise UsageError(
            f"{flag}: {directory!r} cannot be read ({type(error).__name__}: {error})"
        ) from None


def _runs_text(directory: str, fs: Any) -> str:
    try:
        runs = runs_in_bucket(directory, fs)
    except (OSError, TimeoutError):
        runs = []
    if not runs:
        return "a folder of checkpoints (none found beside it)"
    shown = runs[:MAX_RUNS_SHOWN] + (["..."] if len(runs) > MAX_RUNS_SHOWN else [])
    return "a folder of checkpoints: " + ", ".join(shown)


def _folders(fs: Any, path: str) -> list[str]:
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    return [e["name"] for e in entries if e.get("type") == "directory"]


def _step_folders(fs: Any, path: str) -> list[int]:
    steps = []
    for name in _folders(fs, path):
        last = name.rstrip("/").rsplit("/", 1)[-1]
        if last.isascii() and last.isdigit():
            steps.append(int(last))
    return steps
