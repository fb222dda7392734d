"""The processes of a local Ray cluster: its token authentication, killing all of them (agents
included), and holding off signals while that runs. Used by :mod:`workloads.sim.local_cluster`."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
from collections.abc import Iterator
from typing import Any

from workloads import ray_compat

logger = logging.getLogger(__name__)

AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"


@contextlib.contextmanager
def token_auth() -> Iterator[bool]:
    """Within the block, local clusters run with Ray's token authentication, as Ray 2.59+ does
    for ``ray.init()``; yields whether it is on.

    Unless ``RAY_AUTH_MODE`` is set explicitly (``disabled`` opts out), this process gets
    ``RAY_AUTH_MODE=token`` and a random ``RAY_AUTH_TOKEN`` in its environment (the nodes it
    starts inherit them, as KubeRay injects them into every pod; nothing is written to a shared
    disk). Both are taken back at the end, so later Ray use in this process is as before.
    """
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None:
        yield mode.lower() == "token"
        return
    import secrets

    previous_token = os.environ.get(AUTH_TOKEN_ENV)
    os.environ[AUTH_MODE_ENV] = "token"
    os.environ[AUTH_TOKEN_ENV] = previous_token or secrets.token_hex(32)
    ray_compat.reload_auth()
    try:
        yield True
    finally:
        os.environ.pop(AUTH_MODE_ENV, None)
        if previous_token is None:
            os.environ.pop(AUTH_TOKEN_ENV, None)
        ray_compat.reload_auth()


def names_address(text: str, gcs_address: str) -> bool:
    """Whether ``text`` (a command line) names ``gcs_address`` whole: not as the prefix of
    another cluster's (``...:4123`` in ``...:41234``), which would kill that cluster too."""
    return re.search(rf"(?<![\w.:]){re.escape(gcs_address)}(?![\w.:])", text) is not None


def kill_cluster_processes(gcs_address: str, *, timeout_s: float = 10.0) -> int:
    """Kill every process (but this one) of the cluster at ``gcs_address``; how many were killed.

    The cluster's own processes name the address (GCS and raylets in their command line, workers
    in ``RAY_ADDRESS``); the agents a raylet starts carry neither (``ray::DashboardAgent``), so
    they are found as descendants. The marked processes are stopped (SIGSTOP) before their
    descendants are listed, so that none starts another process in between, then all are killed.
    """
    import psutil

    def marked(proc: psutil.Process) -> bool:
        try:
            if names_address(" ".join(proc.cmdline()), gcs_address):
                return True
            return proc.environ().get("RAY_ADDRESS") == gcs_address
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    me = os.getpid()
    roots = [p for p in psutil.process_iter() if p.pid != me and marked(p)]
    killed = _kill_trees(roots, timeout_s)
    if killed:
        logger.info("killed %d processes of cluster %s", killed, gcs_address)
    return killed


def kill_processes_with_env(name: str, value: str, *, timeout_s: float = 10.0) -> int:
    """Kill every process (but this one) whose environment has ``name=value``, and their
    descendants: all processes of one simulated host (its raylet, agents and workers share the
    host's ``TMPDIR``), as when its VM goes away. How many were killed."""
    import psutil

    def marked(proc: psutil.Process) -> bool:
        try:
            return proc.environ().get(name) == value
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False

    me = os.getpid()
    return _kill_trees([p for p in psutil.process_iter() if p.pid != me and marked(p)], timeout_s)


def _kill_trees(roots: list[Any], timeout_s: float) -> int:
    import psutil

    me = os.getpid()
    victims: dict[int, psutil.Process] = {}
    for proc in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.suspend()
            victims[proc.pid] = proc
    for proc in roots:
        with contextlib.suppress(psutil.NoSuchProcess):
            victims.update((c.pid, c) for c in proc.children(recursive=True) if c.pid != me)
    for proc in victims.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(list(victims.values()), timeout=timeout_s)
    return len(victims)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT/SIGTERM during the block are remembered, not raised: cleanup runs to the end."""
    if os.name != "posix":
        yield
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda n, _f: caught.append(n))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)
        if caught:
            logger.warning("deferred %s while stopping", signal.Signals(caught[0]).name)


def free_port() -> int:
    """A TCP port free on localhost right now (never Ray's default 6379)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def agent_ports() -> dict[str, int]:
    """Free ports for one node's agents (never Ray's fixed defaults, which collide)."""
    return {
        "dashboard_agent_listen_port": free_port(),
        "metrics_agent_port": free_port(),
        "metrics_export_port": free_port(),
        "runtime_env_agent_port": free_port(),
    }
