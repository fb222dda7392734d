"""The environment of the test session: set before any test module is collected, so the test
process and everything it starts (Ray nodes and their workers, Ray jobs, ``raytpu demo``
subprocesses, which all inherit it) see it. A value already set in the environment is kept.

- ``NO_GCE_CHECK=true``: the tests never run on a Google Compute Engine VM, so Google's auth
  library must not probe for a metadata server. Without it, building a ``gs://`` filesystem with
  no GCS emulator in the environment (``workloads.storage.ray_train_storage``) waits ~13 s for
  that probe to time out before it falls back to anonymous access. google-auth reads the
  variable once, when it is first imported: hence at configure time, not in a fixture.
- ``JAX_COMPILATION_CACHE_DIR``: one JAX persistent compilation cache for the session (a fresh
  temp folder, removed at the end), for every entry (``..._MIN_COMPILE_TIME_SECS=0``). The same
  model is compiled again and again (each training run's hosts, each Serve replica's batch
  sizes, each ``raytpu demo`` run); from the cache each costs a fraction of a compile. On GKE
  the hosts of a stack can share such a cache in its bucket, so the simulated hosts sharing one
  shares nothing a real host could not.
- ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.5``: Ray Train v2's controller polls its workers every
  2 s by default, and a worker's ``ray.train.report`` (each ``log_every`` steps and at the end)
  waits for that poll; the tests' short runs spent most of those seconds waiting.
- ``RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S=0.5``: how often Ray Train's preemption watcher reads
  Ray's draining nodes (5 s by default); the tests' preemption notices give 12 s.
- ``RAYTPU_<SET>_CRDS``: the CRD sets of :mod:`raytpu.crd_pins`. Where a set is neither fetched
  (``.crds/<set>``) nor named by the environment (CI fetches them at their pins), the development
  copy beside the repository (``../shared/<set>/crds``) when there is one. The code path is the
  one users run; only the folder differs.

And two marks: ``@pytest.mark.crds("gmp", ...)`` skips a test, naming the sets and how to get
them, where those CRD sets are absent (a clone with no ``../shared``, no ``raytpu crds fetch``);
with no argument, every set. And the order of the modules (:func:`pytest_collection_modifyitems`): the longest first, so that
``make test``'s two xdist workers (``--dist loadfile --no-loadscope-reorder``) end together.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from raytpu.crd_pins import LOCAL_HOME, PINS, REPO

_SET: dict[str, str] = {}
"""The variables this session set (to undo at the end)."""


def pytest_configure(config: pytest.Config) -> None:
    wanted = {
        "NO_GCE_CHECK": "true",
        # Before gcsfs is imported: the emulator's client (workloads.sim.gcs_emulator).
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "JAX_COMPILATION_CACHE_DIR": "",
        "RAYTPU_LOG_DIR": "",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
        "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5",
    }
    for row in PINS:
        development_copy = REPO.parent / "shared" / row.name / "crds"
        if not (LOCAL_HOME / row.name).is_dir() and development_copy.is_dir():
            wanted[row.env_var] = str(development_copy)
    for name, value in wanted.items():
        if name in os.environ:
            continue
        if name == "JAX_COMPILATION_CACHE_DIR":
            value = tempfile.mkdtemp(prefix="raytpu-jax-cache-")
        if name == "RAYTPU_LOG_DIR":  # the commands' run logs: not the user's ~/.cache
            value = tempfile.mkdtemp(prefix="raytpu-test-logs-")
        os.environ[name] = _SET[name] = value


def pytest_unconfigure(config: pytest.Config) -> None:
    for name, value in _SET.items():
        if os.environ.get(name) == value:
            del os.environ[name]
    for made in ("JAX_COMPILATION_CACHE_DIR", "RAYTPU_LOG_DIR"):
        folder = _SET.pop(made, None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    _SET.clear()


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("crds")
    if marker is None:
        return
    from raytpu_cli.crds import SETS

    wanted = [s for s in SETS if not marker.args or s.pin.name in marker.args]
    absent = [s for s in wanted if s.missing()]
    if absent:
        how = ", ".join(f"${s.env_var}" for s in absent)
        names = ", ".join(s.pin.name for s in absent)
        pytest.skip(
            f"CRD set(s) {names} absent: schema check NOT run (raytpu crds fetch, or {how})"
        )


LONGEST_FIRST = (
    "test_goodput_ray.py",  # ~770 s under make test on 2 cores (five training runs, 11 attempts)
    "test_obs_prometheus.py",  # ~300 s
    "test_demo.py",  # ~295 s
    "test_cli_console.py",  # ~230 s
    "test_multislice_ray.py",  # ~225 s
    "test_workloads_ray.py",  # ~180 s
)
"""Measured by ``--durations=0`` under ``make test``'s two workers (2026-12-06, this machine). xdist hands a worker the next
module when it is free; by default it orders modules by their number of tests, which put these
(few tests, minutes of Ray each) last, so one worker ran on alone for minutes at the end."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules in :data:`LONGEST_FIRST` order, then the other modules with a ``ray`` mark (a
    local cluster each), then the rest; tests keep their order within a module."""

    with_ray = {item.path for item in items if item.get_closest_marker("ray")}

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name)
        return len(LONGEST_FIRST) + (0 if item.path in with_ray else 1)

    items.sort(key=rank)
