"""The stack's checkpoint bucket for Ray tests: a real GCS emulator, or a clear skip."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from workloads.sim.gcs_emulator import GcsEmulator, GcsEmulatorError


@contextmanager
def gcs_or_skip(*buckets: str) -> Iterator[GcsEmulator]:
    """fake-gcs-server with ``buckets``; the test skips, saying why, only if it cannot start.
    Its environment (``STORAGE_EMULATOR_HOST``...) reaches every Ray node started inside."""
    emulator = GcsEmulator(buckets)
    try:
        emulator.start()
    except GcsEmulatorError as error:
        pytest.skip(f"the GCS emulator (fake-gcs-server) cannot start here: {error}")
    try:
        yield emulator
    finally:
        emulator.stop()
