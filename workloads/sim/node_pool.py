"""The simulated node pool: GKE's part in a preemption or a slice repair, on the local slice cluster.

On GKE a preempted TPU host's pod gets SIGTERM; ``ray start --block`` (the pod's command) then
drains its Ray node with reason *preemption* and a deadline (Ray Train's preemption watcher tells
the workers, :mod:`workloads.training.worker_loop` saves an emergency checkpoint), the VM goes away at the
deadline and the node pool brings up a new one in its place, with an empty disk. A multi-host
slice is repaired whole: when one of its VMs fails GKE recreates every VM of the slice (the
``kill-slice`` fault drains them all with a deadline of now), so every host goes before any new
one starts.

:class:`NodePool` plays the VM and the node pool for a
:class:`workloads.sim.local_cluster.LocalSliceCluster`: a host whose node is drained with a deadline
loses every process at that deadline (or at once, when Ray's drain ended an idle node first) and a
new host of the same slice and worker id starts in a fresh folder, as ``ray start --block`` in
that folder (its own working dir, as a pod's). Ray is imported inside the methods.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from raytpu.ray_names import host_key
from workloads import ray_compat
from workloads.sim.local_processes import agent_ports, kill_processes_with_env

logger = logging.getLogger(__name__)

POLL_S = 0.25
HOST_START_TIMEOUT_S = 60.0


class NodePool:
    """A thread that replaces the cluster's preempted hosts; :meth:`start`, :meth:`stop`."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.replaced: list[tuple[str, int]] = []
        """``(slice name, worker id)`` of every host replaced, in order."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handled: set[str] = set()
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        """Ray node id -> the ``ray start --block`` process of a replacement host."""
        self._starting: dict[tuple[str, int], subprocess.Popen[bytes]] = {}
        """Host -> the process of its replacement, until the replacement registered."""

    def start(self) -> NodePool:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="raytpu-node-pool", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def reap(self) -> None:
        """Wait for the replacement hosts' ``ray start`` processes (after they were killed)."""
        for process in self._processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self._processes = {}

    def _run(self) -> None:
        import ray
        from ray.exceptions import RayError

        doomed: dict[str, float] = {}  # node id -> its deadline (ms); a node seen draining
        while not self._stop.wait(POLL_S):
            try:
                draining = ray_compat.draining_nodes()
                nodes = ray.nodes()
            except (RayError, ConnectionError) as error:
                logger.warning("node pool: cannot read the nodes: %s", error)
                continue
            doomed.update((n, d) for n, d in draining.items() if d and n not in self._handled)
            # An idle raylet drained for preemption exits at once (Ray's drain): its VM is
            # gone as well.
            doomed.update(
                (n["NodeID"], 0)
                for n in nodes
                if not n["Alive"]
                and ray_compat.preempted_by_drain(n)
                and n["NodeID"] not in self._handled
            )
            now_ms = time.time() * 1000
            due = sorted(n for n, deadline_ms in doomed.items() if now_ms >= deadline_ms)
            for node_id in due:
                del doomed[node_id]
                self._handled.add(node_id)
            if due:
                self._replace(due, nodes)

    def _replace(self, node_ids: list[str], nodes: list[dict[str, Any]]) -> None:
        """The VMs of ``node_ids`` go (a preempted host, or every host of a repaired slice),
        all of them before any new one starts; then a new VM each, as the node pool does."""
        cluster = self.cluster
        if cluster.ray_cluster is None:
            return
        started = []
        for node_id in node_ids:
            labels = next((n.get("Labels") or {} for n in nodes if n["NodeID"] == node_id), {})
            key = host_key(labels)
            host = next((h for h in cluster.hosts if (h.slice_name, h.worker_id) == key), None)
            if host is not None:
                self._remove(node_id, key)
                started.append((node_id, key, host))
        for _, key, host in started:
            self._start(key, host)
        for node_id, key, _ in started:
            new_id = self._wait_for_host(key, exclude=node_id)
            self._processes[new_id or f"unregistered {key}"] = self._starting.pop(key)
            logger.warning("node pool: host %s/%d went away; replaced (node %s)", *key, new_id)

    def _remove(self, node_id: str, key: tuple[str, int]) -> None:
        """The VM goes: every process of the host (raylet, agents, workers) at once."""
        cluster = self.cluster
        kill_processes_with_env("TMPDIR", str(cluster.host_dirs[key] / "tmp"))
        process = self._processes.pop(node_id, None)
        if process is not None:
            process.wait(timeout=10)
        for worker in list(cluster.ray_cluster.worker_nodes):
            if worker.node_id == node_id:
                cluster.ray_cluster.remove_node(worker, allow_graceful=False)  # records only

    def _start(self, key: tuple[str, int], host: Any) -> None:
        """A new VM for ``key``: ``ray start --block`` in a fresh folder."""
        cluster = self.cluster
        host_dir = cluster.new_host_dir(f"h-{key[0]}-{key[1]}-r{len(self.replaced)}")
        cluster.host_dirs[key] = host_dir
        with (host_dir / "ray-start.log").open("wb") as log:
            process = subprocess.Popen(
                self._command(host, host_dir),
                cwd=host_dir / "work",
                env={**os.environ, **cluster.host_env(host, host_dir)},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.replaced.append(key)
        self._starting[key] = process

    def _command(self, host: Any, host_dir: Path) -> list[str]:
        cluster, ports = self.cluster, agent_ports()
        return [
            str(Path(sys.executable).with_name("ray")), "start",
            "--address", cluster.gcs_address,
            "--num-cpus", str(cluster.host_cpus),
            "--resources", json.dumps(dict(host.resources)),
            "--labels", ",".join(f"{k}={v}" for k, v in host.labels.items()),
            "--temp-dir", str(host_dir / "ray"),
            "--object-store-memory", str(cluster.object_store_bytes),
            "--dashboard-agent-listen-port", str(ports["dashboard_agent_listen_port"]),
            "--dashboard-agent-grpc-port", str(ports["metrics_agent_port"]),
            "--metrics-export-port", str(ports["metrics_export_port"]),
            "--runtime-env-agent-port", str(ports["runtime_env_agent_port"]),
            "--block",
        ]  # fmt: skip

    def _wait_for_host(self, key: tuple[str, int], exclude: str) -> str:
        """The node id of the live host ``key`` other than ``exclude``, once it registered."""
        import ray

        deadline = time.monotonic() + HOST_START_TIMEOUT_S
        while time.monotonic() < deadline and not self._stop.is_set():
            for node in ray.nodes():
                found = host_key(node.get("Labels") or {})
                if node["Alive"] and node["NodeID"] != exclude and found == key:
                    return str(node["NodeID"])
            time.sleep(POLL_S)
        return ""
