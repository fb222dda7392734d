"""A local Ray cluster shaped like the GKE stack runs it: the simulated TPU slice cluster.

Glossary (Ray's words):

- **head node**: the Ray node that runs the GCS; KubeRay's head pod has no TPU, so ours has none.
- **worker node**: one Ray node per TPU **host** (one TPU VM, one Kubernetes node). A slice of
  ``hosts`` hosts is ``hosts`` worker nodes; a slice config with ``count`` copies gives ``count``
  independent slices.
- **slice name**: ``TPU_NAME``, shared by all hosts of one slice; KubeRay's webhook sets it to
  ``<worker group>-<replica index>``. Here it is ``<slice config name>-<copy index>``.
- **worker id**: ``TPU_WORKER_ID``, 0..hosts-1 inside a slice; worker 0 carries the slice's head
  resource ``TPU-<pod type>-head`` that :mod:`ray.util.tpu` reserves first.

On a real TPU host Ray derives the ``TPU`` resource, the ``accelerator_type:TPU-V6E`` resource, the
slice-name resource, the head resource and the ``ray.io/tpu-*`` labels from the host's environment
and its ``/dev/accel*`` devices. On a CPU machine it detects no TPU and derives nothing (checked
with Ray 2.60: the nodes came up with no labels), so :func:`host_specs` states exactly those
resources and labels, plus the same environment, ``JAX_PLATFORMS=cpu`` and
``--xla_force_host_platform_device_count=<chips per host>`` so that each host process sees one CPU
device per TPU chip. ``jax.distributed`` then joins the host processes into one real mesh.

Each simulated host also gets what a real host does not share with the others: its own working
directory (the raylet's and so its workers' current directory), its own ``TMPDIR`` and its own
Ray temp folder (session, logs, spilled objects), all under one folder per host
(:attr:`LocalSliceCluster.host_dirs`). Files one host writes to a relative path or to its temp
folder are not where another host looks, as on GKE; shared files go to ``gs://`` (the GCS
emulator, :mod:`workloads.sim.gcs_emulator`, stands in for the stack's bucket).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from raytpu.catalog import SliceShape
from raytpu.errors import invalid
from raytpu.ray_names import (
    LABEL_SLICE_NAME,
    LABEL_WORKER_ID,
    host_key,
    shape_labels,
)
from workloads import ray_compat
from workloads.sim.local_processes import (  # free_port: imported from here by many
    agent_ports,
    free_port,
    kill_cluster_processes,
    signals_deferred,
    token_auth,
)
from workloads.sim.node_pool import NodePool

logger = logging.getLogger(__name__)

# Ray's node label keys (ray._raylet.RAY_NODE_TPU_*_KEY); spelled out so that building the specs
# does not import Ray.

DEFAULT_START_TIMEOUT_S = 180.0
"""Bound on bringing up all nodes, every try included (the 2-core machine needs ~5 s per node;
a try that fails on Ray's fixed start-up limits costs 30 to 60 s)."""
START_ATTEMPTS = 3
"""Tries at starting the cluster within :data:`DEFAULT_START_TIMEOUT_S` (see ``start``)."""


class SliceLike(Protocol):
    """What the simulation needs from ``infra.config.SliceConfig``."""

    name: str
    shape: SliceShape
    count: int


class LocalClusterError(RuntimeError):
    """The simulated slice cluster could not start; nothing of it is left running."""


@dataclass(frozen=True)
class SimulatedHost:
    """One TPU host as a Ray worker node: its environment, resources and labels."""

    slice_config: str
    """Name of the slice in the stack config (``train``)."""
    slice_name: str
    """``TPU_NAME``: ``train-0`` for copy 0 of slice ``train``."""
    worker_id: int
    shape: SliceShape
    env: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


def host_specs(slices: Iterable[SliceLike]) -> list[SimulatedHost]:
    """One :class:`SimulatedHost` per host per slice copy, exactly what a real host advertises."""
    hosts: list[SimulatedHost] = []
    for slice_config in slices:
        shape = slice_config.shape
        if int(slice_config.count) < 1:
            raise LocalClusterError(
                invalid(f"slices[{slice_config.name}].count", slice_config.count, "an integer >= 1")
            )
        for copy in range(int(slice_config.count)):
            slice_name = f"{slice_config.name}-{copy}"
            for worker_id in range(shape.hosts):
                env = {
                    "TPU_NAME": slice_name,
                    "TPU_WORKER_ID": str(worker_id),
                    "TPU_ACCELERATOR_TYPE": shape.pod_type,
                    "TPU_TOPOLOGY": shape.topology,
                    "JAX_PLATFORMS": "cpu",
                    "XLA_FLAGS": f"--xla_force_host_platform_device_count={shape.chips_per_host}",
                }
                resources: dict[str, float] = {
                    "TPU": float(shape.chips_per_host),
                    f"accelerator_type:{shape.ray_accelerator_type}": 1.0,
                    slice_name: 1.0,
                }
                if worker_id == 0:
                    resources[shape.ray_head_resource] = 1.0
                labels = {
                    LABEL_SLICE_NAME: slice_name,
                    LABEL_WORKER_ID: str(worker_id),
                    **shape_labels(shape),
                }
                hosts.append(
                    SimulatedHost(
                        slice_config=slice_config.name,
                        slice_name=slice_name,
                        worker_id=worker_id,
                        shape=shape,
                        env=env,
                        resources=resources,
                        labels=labels,
                    )
                )
    return hosts


def _as_worker_zero(host: SimulatedHost) -> SimulatedHost:
    """``host`` with worker id 0 in its environment and labels (what a faulty webhook injects)."""
    return dataclasses.replace(
        host,
        env={**host.env, "TPU_WORKER_ID": "0"},
        labels={**host.labels, LABEL_WORKER_ID: "0"},
    )


class LocalSliceCluster:
    """A Ray head plus one worker node per simulated TPU host; a context manager.

    ``start()`` brings it up and connects this process as the driver; ``stop()`` disconnects and
    kills every process it started. Both are idempotent. Inside ``with``, SIGINT and SIGTERM
    raise :class:`KeyboardInterrupt` so the block unwinds and the cluster stops.
    """

    def __init__(
        self,
        slices: Sequence[SliceLike],
        *,
        head_cpus: int = 1,
        host_cpus: int = 1,
        object_store_mb: int = 100,
        connect: bool = True,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        missing_hosts: Collection[tuple[str, int]] = (),
        env: Mapping[str, str] | None = None,
        replace_preempted: bool = True,
        duplicate_worker_ids: Collection[tuple[str, int]] = (),
    ) -> None:
        """``missing_hosts``: ``(slice name, worker id)`` pairs left out, to simulate a slice
        that lost a host (e.g. ``("broken-0", 1)``). ``env``: extra environment of every node
        (the head and each host), e.g. the GCS emulator's
        (:attr:`workloads.sim.gcs_emulator.GcsEmulator.env`), as a pod spec's ``env`` would.
        ``replace_preempted``: play GKE's part in a preemption (:class:`workloads.sim.node_pool.NodePool`).
        ``duplicate_worker_ids``: ``(slice name, worker id)`` hosts that advertise worker id 0
        as well, the TPU webhook's known fault (a slice on which JAX start-up hangs)."""
        every = host_specs(slices)
        known = {(h.slice_name, h.worker_id) for h in every}
        missing = {(str(name), int(worker)) for name, worker in missing_hosts}
        duplicated = {(str(name), int(worker)) for name, worker in duplicate_worker_ids}
        for field_name, pairs in (("missing_hosts", missing), ("duplicate_worker_ids", duplicated)):
            for pair in sorted(pairs - known):
                raise LocalClusterError(
                    invalid(field_name, pair, (f"({s!r}, {w})" for s, w in sorted(known)))
                )
        every = [
            _as_worker_zero(h) if (h.slice_name, h.worker_id) in duplicated else h for h in every
        ]
        self.hosts = [h for h in every if (h.slice_name, h.worker_id) not in missing]
        self.slices = tuple(slices)
        self._head_cpus = head_cpus
        self._host_cpus = host_cpus
        self._object_store = object_store_mb * 1024 * 1024
        self._connect = connect
        self._start_timeout_s = start_timeout_s
        self._env = dict(env or {})
        self._root: Path | None = None
        self.host_dirs: dict[tuple[str, int], Path] = {}
        """``(slice name, worker id)`` -> that host's own folder (working dir, TMPDIR, Ray temp)."""
        self._cluster: Any = None
        self._previous_handlers: dict[int, Any] = {}
        self._gcs_address: str | None = None
        self._auth: contextlib.ExitStack | None = None
        self.address: str | None = None
        self.start_seconds: float | None = None
        self.interrupted: str | None = None
        """The signal (``SIGINT``, ``SIGTERM``) that interrupted the ``with`` block, if any."""
        self.stopped_processes = 0
        """Processes of this cluster that :meth:`stop` killed."""
        self._replace_preempted = replace_preempted
        self._node_pool: NodePool | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> LocalSliceCluster:
        """Start the head and all hosts; on any failure stop what started and re-raise.

        Up to :data:`START_ATTEMPTS` tries, within the same ``start_timeout_s``: on a machine
        overloaded by other work a raylet can die at start-up waiting for its agents' port files
        (Ray issues #62883 and #65983: a fixed 15 s limit), or the head's raylet not register
        within Ray's fixed 30 s ("The current node timed out during startup"; seen twice in a row
        here while another simulated cluster trained beside it). Agent ports are pinned up front
        to make that rarer. Never
        after SIGINT/SIGTERM: an interrupt stops the start even where Python ignored the
        ``KeyboardInterrupt`` (raised inside logging's at-fork hook while Ray spawns a process).
        """
        if self._cluster is not None:
            return self
        began = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self._start_once(began)
                if self.interrupted:  # a signal some Ray start-up code caught: still a stop
                    raise KeyboardInterrupt(f"signal {self.interrupted}")
                break
            except Exception as error:
                self.stop()
                if self.interrupted:  # the Ctrl-C also killed the group's Ray processes
                    raise KeyboardInterrupt(f"signal {self.interrupted}") from error
                left_s = self._start_timeout_s - (time.monotonic() - began)
                if attempt == START_ATTEMPTS or left_s < 30:
                    raise
                logger.warning(
                    "local slice cluster did not start (%s); try %d of %d in %.0f s left",
                    error,
                    attempt + 1,
                    START_ATTEMPTS,
                    left_s,
                )
            except BaseException:
                self.stop()
                raise
        self.start_seconds = time.monotonic() - began
        logger.info(
            "local slice cluster up at %s: head + %d simulated TPU hosts in %.1f s",
            self.address,
            len(self.hosts),
            self.start_seconds,
        )
        return self

    def _start_once(self, began: float) -> None:
        import ray

        # The address is fixed up front so every node's processes get RAY_ADDRESS: Ray's own
        # helpers that auto-detect "the" cluster (Ray Train's PlacementGroupCleaner uses the
        # state API) would otherwise fail when other Ray instances run on this machine.
        if self._auth is None:
            self._auth = contextlib.ExitStack()
            self._auth.enter_context(token_auth())
        gcs_port = free_port()
        address = f"{ray.util.get_node_ip_address()}:{gcs_port}"
        self._gcs_address = address  # known before any process starts: stop() can find them all
        # Short: Ray's socket paths under each temp folder must stay below 108 bytes.
        self._root = Path(tempfile.mkdtemp(prefix="raytpu-hosts-"))
        head_dir = self._node_dir("head")  # Ray's temp folder stays its default (/tmp/ray)
        self._cluster = ray_compat.local_cluster(
            {
                "num_cpus": self._head_cpus,
                "include_dashboard": False,
                "gcs_server_port": gcs_port,
                "env_vars": {**self._env, "TMPDIR": str(head_dir / "tmp"), "RAY_ADDRESS": address},
                "object_store_memory": self._object_store,
                **agent_ports(),
            },
        )
        for index, host in enumerate(self.hosts):
            self._check_deadline(began)
            host_dir = self._node_dir(f"h{index}")
            self.host_dirs[(host.slice_name, host.worker_id)] = host_dir
            # wait=False: the raylets start in parallel; wait_for_nodes below bounds it. The
            # raylet starts in the host's own folder, and its workers inherit it.
            with contextlib.chdir(host_dir / "work"):
                self._cluster.add_node(
                    wait=False,
                    num_cpus=self._host_cpus,
                    resources=dict(host.resources),
                    labels=dict(host.labels),
                    temp_dir=str(host_dir / "ray"),
                    # Its logs are in its own folder: it forwards them itself, as a real host.
                    include_log_monitor=True,
                    env_vars=self.host_env(host, host_dir),
                    object_store_memory=self._object_store,
                    **agent_ports(),
                )
        self._cluster.wait_for_nodes(timeout=self._remaining(began))
        self.address = self._cluster.address
        if self._connect:
            ray.init(
                address=self.address,
                include_dashboard=False,
                log_to_driver=True,
                logging_level=logging.WARNING,
            )
            if self._previous_handlers:  # inside `with`: take SIGTERM back from ray.init()
                self._install_signal_handlers()
            if self._replace_preempted:
                self._node_pool = NodePool(self).start()

    def stop(self) -> None:
        """Disconnect the driver and kill every process of the cluster. Safe to call twice.

        Ray's own shutdown kills the processes it tracks, but an interrupt during start-up left
        agents (DashboardAgent, RuntimeEnvAgent) behind it, re-parented to PID 1. So every
        process of the cluster and its descendants are killed first
        (:func:`kill_cluster_processes`), then Ray's records are tidied. Signals are held off
        while stopping.
        """
        import ray

        with signals_deferred():
            if self._node_pool is not None:
                self._node_pool.stop()
            cluster, self._cluster = self._cluster, None
            with contextlib.suppress(Exception):
                if self._connect and ray.is_initialized():
                    ray.shutdown()
            if self._gcs_address is not None:
                self.stopped_processes += kill_cluster_processes(self._gcs_address)
                self._gcs_address = None
            if cluster is not None:
                cluster.shutdown()  # its processes are gone: this only tidies Ray's records
                logger.info("local slice cluster stopped")
            auth, self._auth = self._auth, None
            if auth is not None:
                auth.close()
            if self._node_pool is not None:
                self._node_pool.reap()  # its hosts' processes were killed above
            root, self._root = self._root, None
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)
            self.host_dirs = {}
        self.address = None

    def __enter__(self) -> LocalSliceCluster:
        self._install_signal_handlers()
        try:
            return self.start()
        except BaseException:
            self._restore_signal_handlers()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            self._restore_signal_handlers()

    # -- helpers ---------------------------------------------------------------------------
    def _node_dir(self, name: str) -> Path:
        assert self._root is not None
        node_dir = self._root / name
        for sub in ("work", "tmp", "ray"):
            (node_dir / sub).mkdir(parents=True, exist_ok=True)
        return node_dir

    def _remaining(self, began: float) -> float:
        return max(1.0, self._start_timeout_s - (time.monotonic() - began))

    def _check_deadline(self, began: float) -> None:
        if time.monotonic() - began > self._start_timeout_s:
            raise LocalClusterError(
                f"local slice cluster: not up after {self._start_timeout_s:.0f} s "
                f"({len(self.hosts)} hosts requested)"
            )

    def _install_signal_handlers(self) -> None:
        """SIGINT and SIGTERM unwind the ``with`` block (KeyboardInterrupt). A SIGTERM that comes
        while another SIGINT handler is in charge (Ray Train's, which aborts a run gracefully)
        is handed to that handler, so both signals stop a run the same way. Called again after
        ``ray.init()``, which installs a SIGTERM handler of its own (``sys.exit``)."""

        def interrupt(signum: int, frame: FrameType | None) -> None:
            self.interrupted = self.interrupted or signal.Signals(signum).name
            current = signal.getsignal(signal.SIGINT)
            if signum == signal.SIGTERM and callable(current) and current is not interrupt:
                current(signal.SIGINT, frame)
                return
            raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

        if os.name != "posix":
            return
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous = signal.signal(signum, interrupt)
                self._previous_handlers.setdefault(signum, previous)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)
        self._previous_handlers.clear()

    def remove_host(self, slice_name: str, worker_id: int) -> str:
        """Kill one simulated host's node (a lost TPU VM); returns its Ray node id."""
        import ray

        if self._cluster is None:
            raise LocalClusterError("remove_host: the cluster is not running")
        for node in ray.nodes():
            if node.get("Alive") and host_key(node.get("Labels") or {}) == (slice_name, worker_id):
                node_id = node["NodeID"]
                for worker in list(self._cluster.worker_nodes):
                    if worker.node_id == node_id:
                        self._cluster.remove_node(worker, allow_graceful=False)
                        return node_id
        valid = [f"({h.slice_name!r}, {h.worker_id})" for h in self.hosts]
        raise LocalClusterError(invalid("remove_host", (slice_name, worker_id), valid))

    # -- for the node pool (workloads.sim.node_pool) --------------------------------------------
    def host_env(self, host: SimulatedHost, host_dir: Path) -> dict[str, str]:
        """The environment of ``host``'s processes (as its pod spec would give them)."""
        assert self._gcs_address is not None
        return {
            **self._env,
            **host.env,
            "TMPDIR": str(host_dir / "tmp"),
            "RAY_ADDRESS": self._gcs_address,
        }

    def new_host_dir(self, name: str) -> Path:
        return self._node_dir(name)

    @property
    def gcs_address(self) -> str:
        return self._gcs_address or ""

    @property
    def host_cpus(self) -> int:
        return self._host_cpus

    @property
    def object_store_bytes(self) -> int:
        return self._object_store

    @property
    def ray_cluster(self) -> Any:
        """Ray's ``cluster_utils.Cluster`` behind this one (``None`` when stopped)."""
        return self._cluster

    @property
    def replaced(self) -> list[tuple[str, int]]:
        """``(slice name, worker id)`` of every host replaced after a preemption, in order."""
        return list(self._node_pool.replaced) if self._node_pool else []

    def describe(self) -> list[dict[str, Any]]:
        """One row per simulated host, for summaries."""
        return [
            {
                "slice": host.slice_name,
                "worker": host.worker_id,
                "podType": host.shape.pod_type,
                "topology": host.shape.topology,
                "chips": host.shape.chips_per_host,
                "dir": str(self.host_dirs.get((host.slice_name, host.worker_id), "")),
            }
            for host in self.hosts
        ]


@contextlib.contextmanager
def local_slice_cluster(slices: Sequence[SliceLike], **kwargs: Any) -> Iterator[LocalSliceCluster]:
    """``with local_slice_cluster(stack.slices) as cluster:`` -- start, yield, always stop."""
    with LocalSliceCluster(slices, **kwargs) as cluster:
        yield cluster
