"""Where the Prometheus binaries are (Debian's ``prometheus`` package, ``make prometheus``)."""

from __future__ import annotations

import shutil

import pytest


def binary(name: str) -> str:
    """Path of ``prometheus`` / ``promtool``; fails (never skips) when it is not installed."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make prometheus` (apt-get install prometheus)")
    return found
