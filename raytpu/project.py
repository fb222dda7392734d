"""Which Pulumi project and stack file a command reads: Pulumi's rule, in one place.

The Pulumi CLI uses the project of the current directory: the nearest folder, searching upwards,
that holds ``Pulumi.yaml`` (``--cwd DIR`` starts the search in DIR instead). A stack ``S`` of
that project is configured in ``Pulumi.S.yaml`` beside it. Stdlib only.
"""

from __future__ import annotations

import re
from pathlib import Path

from raytpu.errors import invalid

PROJECT_FILE = "Pulumi.yaml"
STACK_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}")
"""Pulumi's stack names: letters, digits, '_', '.', '-' (so a name is never a path)."""


class ProjectError(ValueError):
    """No Pulumi project or no such stack; the message says where it looked and what is valid."""


def find_project(start: Path | str | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: the current directory) with Pulumi.yaml."""
    begin = Path(start) if start is not None else Path.cwd()
    if not begin.is_dir():
        raise ProjectError(f"--cwd: {str(begin)!r} is not a directory; valid: an existing folder")
    folder = begin.resolve()
    for candidate in (folder, *folder.parents):
        if (candidate / PROJECT_FILE).is_file():
            return candidate
    raise ProjectError(
        f"no {PROJECT_FILE} in {folder} or any folder above it; valid: run inside a Pulumi "
        f"project, or pass --cwd DIR (a folder at or below the one holding {PROJECT_FILE})"
    )


def stack_file(project_dir: Path, stack: str) -> Path:
    return Path(project_dir) / f"Pulumi.{stack}.yaml"


def available_stacks(project_dir: Path) -> tuple[str, ...]:
    """Stacks with a ``Pulumi.<stack>.yaml`` in ``project_dir``, sorted."""
    return tuple(
        sorted(
            p.name[len("Pulumi.") : -len(".yaml")]
            for p in Path(project_dir).glob("Pulumi.*.yaml")
            if STACK_NAME_RE.fullmatch(p.name[len("Pulumi.") : -len(".yaml")])
        )
    )


def resolve_stack_file(stack: str, project_dir: Path) -> Path:
    """``project_dir/Pulumi.<stack>.yaml``; raises :class:`ProjectError` naming the valid stacks."""
    path = stack_file(project_dir, stack)
    if not STACK_NAME_RE.fullmatch(stack) or not path.is_file():
        valid = (
            ", ".join(available_stacks(project_dir)) or f"(no Pulumi.<stack>.yaml in {project_dir})"
        )
        raise ProjectError(invalid("stack", stack, f"{valid} (no {path})"))
    return path
