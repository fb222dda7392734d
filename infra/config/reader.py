"""The reader kit: walk a config mapping by key path and collect every problem.

Each problem names the key path, the bad value and the valid values; nothing raises until
all sections are read."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from infra.config.schema import WorkerResources
from raytpu.errors import invalid

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")


class Problems:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def bad(self, path: str, value: Any, valid: str, hint: str = "") -> None:
        if value is None:
            message = f"{path}: is required; valid: {valid}"
        else:
            message = invalid(path, value, valid)
        if hint:
            message += f" ({hint})"
        self.errors.append(message)


MISSING = object()


class Section:
    """One mapping of the config at ``path``: unknown keys are reported, values read by key."""

    def __init__(self, problems: Problems, path: str, raw: Any, keys: Iterable[str]) -> None:
        self.problems = problems
        self.path = path
        self.keys = tuple(keys)
        self.ok = isinstance(raw, Mapping)
        if not self.ok:
            problems.bad(path, raw, f"a mapping with keys {', '.join(self.keys)}")
            raw = {}
        self.raw: Mapping[str, Any] = raw
        for key in raw:
            if key not in self.keys:
                problems.bad(f"{path}.{key}", key, ", ".join(self.keys), "unknown key")

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}"

    def get(
        self,
        key: str,
        kind: type | tuple[type, ...],
        default: Any = MISSING,
        *,
        valid: str,
        check: Callable[[Any], bool] | None = None,
        hint: str = "",
    ) -> Any:
        """The value at ``key`` (``default`` when absent; required when no default)."""
        value = self.raw.get(key, MISSING)
        if value is MISSING or value is None:
            if default is MISSING:
                self.problems.bad(self.sub(key), None, valid, hint)
                return None
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        is_bool = isinstance(value, bool)
        if (is_bool and bool not in kinds) or not isinstance(value, kinds):
            self.problems.bad(self.sub(key), value, valid, hint)
            return None
        if check is not None and not check(value):
            self.problems.bad(self.sub(key), value, valid, hint)
            return None
        return value


def name_check(max_len: int) -> Callable[[Any], bool]:
    return lambda v: bool(NAME_RE.match(v)) and len(v) <= max_len


def name_valid(max_len: int) -> str:
    return f"lowercase letters, digits and '-', starting with a letter, at most {max_len} chars"


def int_range(low: int, high: int) -> Callable[[Any], bool]:
    return lambda v: low <= v <= high


def list_of(problems: Problems, path: str, raw: Any, *, required: bool) -> list[Any]:
    if raw is None:
        if required:
            problems.bad(path, None, "a list of mappings")
        return []
    if not isinstance(raw, list):
        problems.bad(path, raw, "a list of mappings")
        return []
    return raw


def resources(section: Section, key: str, default: WorkerResources) -> WorkerResources:
    inner = Section(section.problems, section.sub(key), section.raw.get(key, {}), ("cpu", "memory"))
    valid = "a Kubernetes quantity as a string, e.g. '8', '500m', '32Gi'"

    def quantity(v: Any) -> bool:
        return bool(QUANTITY_RE.match(v))

    cpu = inner.get("cpu", str, default.cpu, valid=valid, check=quantity)
    memory = inner.get("memory", str, default.memory, valid=valid, check=quantity)
    return WorkerResources(cpu or default.cpu, memory or default.memory)


def check_unique(problems: Problems, path: str, names: list[tuple[int, str]], what: str) -> None:
    seen: dict[str, int] = {}
    for index, name in names:
        if not isinstance(name, str):
            continue  # a name that is not a string has its own error where it is parsed
        if name in seen:
            problems.bad(
                f"{path}[{index}].name",
                name,
                f"a name not used elsewhere ({what})",
                f"duplicate of {path}[{seen[name]}]",
            )
        else:
            seen[name] = index
