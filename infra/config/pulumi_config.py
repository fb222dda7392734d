"""The Pulumi adapter: the stack being deployed, read from the engine's config (inside ``pulumi
up`` / ``preview``). The only module of the config package that imports pulumi (lazily)."""

from __future__ import annotations

import json
from typing import Any

from infra.config.schema import StackConfig
from infra.config.stack import parse_config


def _decode(value: Any) -> Any:
    """Pulumi hands structured config to the program as JSON text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if value in ("true", "false"):
        return value == "true"
    return value


def from_pulumi() -> StackConfig:
    """The configuration of the stack being deployed (inside ``pulumi up`` / ``preview``)."""
    from pulumi.runtime import config as runtime_config

    merged: dict[str, Any] = dict(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    raw: dict[str, Any] = {}
    for key, value in merged.items():
        # Older engines spell keys "ray-tpu:config:slices"; newer ones "ray-tpu:slices".
        namespace, _, rest = key.partition(":")
        if rest.startswith("config:"):
            key = f"{namespace}:{rest[len('config:') :]}"
        raw[key] = _decode(value)
    return parse_config(raw)
