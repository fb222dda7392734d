"""Local Ray nodes for the delivery tests: a head with the dashboard (Job Submission API) and,
optionally, simulated TPU hosts joined to it, each a ``ray start --block`` in its own process group.

Only the process groups started here are ever signalled; ``ray stop`` is never used (it would
stop every Ray cluster on the machine, other people's included). Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

from raytpu import processes

RAY = Path(sys.executable).with_name("ray")
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 1.0
"""SIGTERM, then SIGKILL of the process groups started here: a Ray head drains for up to 30 s
on SIGTERM, which a test's throwaway cluster does not need (with 5 s here every stop took the
whole 5 s and ended in SIGKILL anyway)."""
ATTEMPTS = 3
SLOW_MACHINE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # On a busy 2-core machine a node's Python agents take 15-20 s to start; the raylet's
    # default patience for them is shorter and it aborts the node ("Timed out waiting for file
    # .../dashboard_agent_listen_port_<node id>").
    "RAY_raylet_start_wait_time_s": "120",
    "RAY_agent_register_timeout_ms": "120000",
}


class RayNodesError(RuntimeError):
    """A local Ray node did not come up; carries the tail of its log."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on localhost right now (never Ray's default 6379)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class LocalRay:
    """A running local Ray cluster: its dashboard address and the processes started for it."""

    address: str
    """Dashboard / Job Submission API, ``http://127.0.0.1:PORT``."""
    gcs_address: str
    temp_dir: Path
    processes: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    token: str | None = None
    """With token authentication (``RAY_AUTH_MODE=token``): the token every request needs."""

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def add_host(
        self,
        *,
        resources: Mapping[str, float],
        labels: Mapping[str, str],
        env: Mapping[str, str],
        num_cpus: int = 1,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        """Join a worker node (a simulated TPU host) and wait until it is alive.

        The host gets a folder of its own, as a TPU VM has its own disk: its working directory,
        ``TMPDIR`` and Ray temp folder. A node that dies while starting (a port taken meanwhile,
        a slow agent) is started again on new ports, at most :data:`ATTEMPTS` times.
        """
        wanted = self.alive_nodes() + 1
        host_dir = self.temp_dir / f"h{len(self.processes)}"
        for sub in ("work", "tmp", "ray"):
            (host_dir / sub).mkdir(parents=True, exist_ok=True)
        for attempt in range(1, ATTEMPTS + 1):
            process, log = _start(
                [
                    "start",
                    f"--address={self.gcs_address}",
                    f"--num-cpus={num_cpus}",
                    f"--resources={json.dumps(dict(resources))}",
                    "--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
                    *_agent_port_args(),
                    "--object-store-memory=100000000",
                    f"--temp-dir={host_dir / 'ray'}",
                ],
                self.temp_dir / f"node-{len(self.processes)}-{attempt}.log",
                {**env, "TMPDIR": str(host_dir / "tmp"), **_auth_env(self.token)},
                cwd=host_dir / "work",
            )
            self.processes.append((process, log))
            try:
                self._wait(lambda: self.alive_nodes() >= wanted, timeout_s, "node alive")
                return
            except RayNodesError:
                processes.stop([process], timeout_s=STOP_TIMEOUT_S, group=True)
                self.processes.remove((process, log))
                if attempt == ATTEMPTS:
                    raise

    def alive_nodes(self) -> int:
        """Nodes the dashboard's state API reports ALIVE (0 while it does not answer)."""
        try:
            reply = requests.get(
                f"{self.address}/api/v0/nodes", timeout=5, headers=self.headers
            ).json()
            nodes = reply["data"]["result"]["result"]
        except (requests.exceptions.RequestException, KeyError, TypeError, ValueError):
            return 0
        return sum(1 for n in nodes if n.get("state") == "ALIVE")

    def _wait(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            for process, log in self.processes:
                if process.poll() is not None:
                    raise RayNodesError(
                        f"ray {process.args[1:3]} exited {process.returncode}:\n"
                        + log.read_text(errors="replace")[-3000:]
                    )
            if time.monotonic() > deadline:
                raise RayNodesError(f"{what}: not ready after {timeout_s:.0f} s ({self.address})")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop every node started here."""
        processes.stop([p for p, _ in self.processes], timeout_s=STOP_TIMEOUT_S, group=True)


def _agent_port_args() -> list[str]:
    """Fixed ports for a node's agents. With port 0 the raylet waits for each agent to write the
    port it chose to a file, and aborts when that takes long (seen on this busy shared machine:
    "Timed out waiting for file .../metrics_agent_port_<node id>"). A fixed port can be taken
    before Ray binds it: the callers start the node again on new ports."""
    listen, grpc, metrics, runtime_env = free_ports(4)
    return [
        f"--dashboard-agent-listen-port={listen}",
        f"--dashboard-agent-grpc-port={grpc}",
        f"--metrics-export-port={metrics}",
        f"--runtime-env-agent-port={runtime_env}",
    ]


def _start(
    args: list[str],
    log: Path,
    extra_env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> tuple[subprocess.Popen[bytes], Path]:
    # Jobs run `python ...`: as in the Ray image, the Python that runs Ray comes first on PATH.
    path = f"{RAY.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, **SLOW_MACHINE_ENV}
    for inherited in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        env.pop(inherited, None)  # a node's auth is what its caller asks for, never inherited
    env.update(extra_env or {})
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(RAY), *args, "--block", "--disable-usage-stats"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    return process, log


def _auth_env(token: str | None) -> dict[str, str]:
    """Ray's auth mode, always explicit: left unset, ``ray start`` turns token auth on by itself
    whenever a token file exists (``~/.ray/auth_token``, written by any local ``ray.init()``)."""
    return (
        {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        if token
        else {"RAY_AUTH_MODE": "disabled"}
    )


def _start_head(head_cpus: int, timeout_s: float, token: str | None = None) -> LocalRay:
    gcs, dashboard, client = free_ports(3)
    temp_dir = Path(tempfile.mkdtemp(prefix="rtd", dir="/tmp"))  # short: Ray's socket paths
    cluster = LocalRay(
        address=f"http://127.0.0.1:{dashboard}",
        gcs_address=f"127.0.0.1:{gcs}",
        temp_dir=temp_dir,
        token=token,
    )
    cluster.processes.append(
        _start(
            [
                "start",
                "--head",
                f"--port={gcs}",
                f"--dashboard-port={dashboard}",
                "--dashboard-host=127.0.0.1",
                *_agent_port_args(),
                f"--ray-client-server-port={client}",
                "--include-dashboard=true",
                f"--num-cpus={head_cpus}",
                f"--temp-dir={temp_dir}",
                "--object-store-memory=100000000",
            ],
            temp_dir / "head.log",
            {"JAX_PLATFORMS": "cpu", **_auth_env(token)},
        )
    )
    try:
        cluster._wait(lambda: cluster.alive_nodes() >= 1, timeout_s, "Ray head and dashboard")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextmanager
def local_ray(
    *, head_cpus: int = 1, timeout_s: float = START_TIMEOUT_S, token: str | None = None
) -> Iterator[LocalRay]:
    """A Ray head with the dashboard on free ports in a fresh temp dir; stopped on exit.
    With ``token``, the head runs Ray's token authentication (``RAY_AUTH_MODE=token``).

    A head that dies while starting is started again on new ports, at most :data:`ATTEMPTS`
    times."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            cluster = _start_head(head_cpus, timeout_s, token)
            break
        except RayNodesError:
            if attempt == ATTEMPTS:
                raise
    try:
        yield cluster
    finally:
        cluster.stop()


def fake_kubectl(folder: Path, secret: str, token: str) -> Path:
    """A folder with a ``kubectl`` that answers ``get secret <secret>`` with ``token`` (base64),
    as the real one does for a user allowed to read it, and Forbidden for anything else."""
    import base64
    import stat

    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "kubectl"
    encoded = base64.b64encode(token.encode()).decode()
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1 $2 $3" = "get secret {secret}" ]; then\n'
        f"  printf '%s' '{encoded}'; exit 0\n"
        "fi\n"
        'echo "Error from server (Forbidden): $*" >&2; exit 1\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder
