"""Reading resource properties as the Pulumi engine hands them to a policy.

During ``pulumi preview`` a property may be *unknown* (it depends on an output not yet computed):
pulumi_policy's proxy raises ``UnknownValueError`` on access, ``pulumi preview --json`` and stack
files carry the engine's sentinel strings, mocks may give ``None``. Rules read properties only
through :func:`get` and the ``as_*`` helpers here, which turn all of that into :data:`UNKNOWN` or
``None``; a rule skips a check whose inputs are unknown instead of guessing or crashing.
Numbers arrive as floats (``4.0``) from the engine and as strings (``"4"``) from Kubernetes
quantities; :func:`as_int` accepts both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final


class _Unknown:
    """A value not known until the update runs (Pulumi's computed value)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown>"

    def __bool__(self) -> bool:
        return False


UNKNOWN: Final = _Unknown()

# The engine's sentinels for unknown values (pulumi sdk/go/common/resource/properties.go; the same
# strings pulumi_policy.proxy checks). tests/test_policies_values.py asserts they match.
UNKNOWN_SENTINELS: Final = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",  # boolean
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",  # number
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",  # string
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",  # array
        "030794c1-ac77-496b-92df-f27374a8bd58",  # asset
        "e48ece36-62e2-4504-bad9-02848725956a",  # archive
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",  # object
    }
)
_SIG_KEY: Final = "4dabf18193072939515e22adb298388d"
_SECRET_SIG: Final = "1b47061264138c4ac30d75fd1eb44270"


def is_unknown(value: Any) -> bool:
    return value is UNKNOWN or (isinstance(value, str) and value in UNKNOWN_SENTINELS)


def plain(value: Any) -> Any:
    """A plain copy of ``value``: dicts, lists and scalars, with every unknown as :data:`UNKNOWN`.

    Unwraps pulumi_policy's unknown-checking and secret proxies (without tripping them: they hand
    out their raw target under the key ``"__target"``), and the engine's secret envelopes from
    ``pulumi stack export`` / ``preview --json`` (the secret's value when it is in clear text,
    else unknown).
    """
    target = _proxy_target(value)
    if target is not None:
        return plain(target)
    if is_unknown(value):
        return UNKNOWN
    if isinstance(value, Mapping):
        if value.get(_SIG_KEY) == _SECRET_SIG:
            if "value" in value:
                return plain(value["value"])
            if "plaintext" in value:
                try:
                    return plain(json.loads(value["plaintext"]))
                except (TypeError, ValueError):
                    return UNKNOWN
            return UNKNOWN
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [plain(v) for v in value]
    secret_value = getattr(value, "value", None)
    if type(value).__name__ == "Secret" and secret_value is not None:
        return plain(secret_value)
    return value


def _proxy_target(value: Any) -> Any:
    """The raw target of a pulumi_policy proxy (which all answer ``["__target"]``), else None."""
    if type(value).__module__.startswith("pulumi_policy."):
        try:
            return value["__target"]
        except (KeyError, TypeError, IndexError):
            return None
    return None


_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def get(props: Any, path: str, default: Any = None) -> Any:
    """The value at ``path`` (``"spec.workerGroupSpecs[0].numOfHosts"``) or ``default``.

    Returns :data:`UNKNOWN` when the path runs through an unknown value, ``default`` when a step
    is missing or has the wrong type (a list where a mapping should be, ...).
    """
    current = props
    for name, index in _STEP.findall(path):
        if is_unknown(current):
            return UNKNOWN
        if name:
            if not isinstance(current, Mapping) or name not in current:
                return default
            current = current[name]
        else:
            if not isinstance(current, Sequence) or isinstance(current, str):
                return default
            i = int(index)
            if i >= len(current):
                return default
            current = current[i]
    if is_unknown(current):
        return UNKNOWN
    return current


def as_int(value: Any) -> int | _Unknown | None:
    """An integer from ``4``, ``4.0`` or ``"4"``; None when absent or not a whole number."""
    if is_unknown(value):
        return UNKNOWN
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        return int(value)
    return None


def as_str(value: Any) -> str | _Unknown | None:
    """A non-empty string, :data:`UNKNOWN`, or None (absent, empty or not a string)."""
    if is_unknown(value):
        return UNKNOWN
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def as_list(value: Any) -> list[Any] | _Unknown:
    """A list (empty when absent or not a list), or :data:`UNKNOWN`."""
    if is_unknown(value):
        return UNKNOWN
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return []


def as_map(value: Any) -> dict[str, Any] | _Unknown:
    """A mapping (empty when absent or not a mapping), or :data:`UNKNOWN`."""
    if is_unknown(value):
        return UNKNOWN
    if isinstance(value, Mapping):
        return dict(value)
    return {}
