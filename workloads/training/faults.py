"""Fault injection for training runs: ``kill-host@40``, ``kill-slice@40``, ``hang@70:1``, ``spike@30``.

A **fault spec** is ``KIND@STEP`` or ``KIND@STEP:HOST``: at optimizer step ``STEP`` (the step
about to run, counted from 0) the worker of host ``HOST`` (``jax.process_index()``, default the
last host) does:

- ``kill-host``: loses its local disk (the fast checkpoint tier, :mod:`workloads.training.checkpoint_tiers`) and its
  process dies at once (SIGKILL), as a host that goes away;
- ``kill-slice``: every host of that host's slice goes away at once, as when GKE repairs a
  multi-host slice (it recreates all of the slice's VMs, never one): the host drains every Ray
  node of its slice with a deadline of now (no time for an emergency save) and dies; the local
  slice cluster's node pool then brings up a new slice of the same shape (new node ids, empty
  disks, :class:`workloads.sim.node_pool.NodePool`);
- ``hang``: stops making progress (sleeps) until the hang watchdog (:mod:`workloads.training.goodput`)
  sees it;
- ``spike``: trains that step on a corrupt batch (uniform random bytes, a real loss spike; the
  spike affects every host since the loss is global, ``HOST`` is ignored);
- ``slow-host``: from that step on, ``SLOW_HOST_DELAY_S`` (1 s) more per step on that host. The
  host stays slow: once the fault fired, it is keyed to the host it hit (``slice/worker``), not
  to a process index, so after a restart it slows that host's new worker, and no other.
- ``preempt``: a preemption notice for that host: its Ray node is drained with reason
  *preemption* and a deadline ``grace_s`` ahead, which is what ``ray start --block`` does when
  GKE sends the host's pod SIGTERM (Ray Train's preemption watcher then tells every worker, which
  saves an emergency checkpoint if it fits). The host goes away at the deadline; the local slice
  cluster then starts a new one in its place (:class:`workloads.sim.local_cluster.LocalSliceCluster`).

Each other fault fires once per run: the driver passes only the faults not yet fired to a
restarted attempt (:class:`FaultPlan`). Used by tests, ``bench/goodput.py`` and ``raytpu train
--inject``. The parsing is stdlib only; :meth:`FaultPlan.apply` runs in a worker.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytpu.errors import invalid

KINDS = ("kill-host", "kill-slice", "hang", "spike", "slow-host", "preempt")
SLOW_HOST_DELAY_S = 1.0
HANG_SLEEP_S = 3600.0
"""How long an injected hang sleeps (the watchdog ends it long before)."""


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    step: int
    host: int = -1
    """``jax.process_index()`` of the faulty host; ``-1``: the last host."""

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}" + ("" if self.host == -1 else f":{self.host}")

    def host_index(self, process_count: int) -> int:
        return process_count - 1 if self.host == -1 else self.host


def parse_fault(text: str, *, field: str = "inject") -> FaultSpec:
    """``KIND@STEP[:HOST]`` -> :class:`FaultSpec`; ``ValueError`` naming the field, the value and
    what is valid."""
    valid = f"KIND@STEP[:HOST] with KIND one of {', '.join(KINDS)}, STEP >= 0, HOST >= 0"
    kind, at, rest = text.strip().partition("@")
    if not at or kind not in KINDS:
        raise ValueError(invalid(field, text, valid))
    step_text, colon, host_text = rest.partition(":")
    try:
        step = int(step_text)
        host = int(host_text) if colon else -1
    except ValueError:
        raise ValueError(invalid(field, text, valid)) from None
    if step < 0 or (colon and host < 0):
        raise ValueError(invalid(field, text, valid))
    return FaultSpec(kind, step, host)


def parse_faults(texts: Iterable[str], *, field: str = "inject") -> tuple[FaultSpec, ...]:
    return tuple(parse_fault(t, field=field) for t in texts)


def check_hosts(
    faults: Iterable[FaultSpec], process_count: int, steps: int, *, field: str = "inject"
) -> None:
    """Every fault names a host of the run and a step it reaches."""
    for fault in faults:
        if fault.host >= process_count:
            raise ValueError(
                f"{field}: {str(fault)!r} names host {fault.host}; valid: 0..{process_count - 1}"
            )
        if fault.step >= steps:
            raise ValueError(
                f"{field}: {str(fault)!r} is at step {fault.step}; valid: 0..{steps - 1}"
            )


@dataclass(frozen=True)
class FaultPlan:
    """The faults of one attempt, as the workers apply them."""

    faults: tuple[FaultSpec, ...] = ()

    def to_config(self) -> list[str]:
        return [str(f) for f in self.faults]

    @classmethod
    def from_config(cls, raw: Iterable[str]) -> FaultPlan:
        return cls(parse_faults(raw))

    def without(self, fired: Iterable[str]) -> FaultPlan:
        """The plan less the faults that fired; a slow host stays (a condition, not an event)."""
        gone = set(fired)
        return FaultPlan(
            tuple(f for f in self.faults if f.kind == "slow-host" or str(f) not in gone)
        )

    def at(self, step: int, process_index: int, process_count: int) -> list[FaultSpec]:
        """The one-shot faults this host applies before ``step`` (a spike on every host); a slow
        host is not one: see :meth:`slow_at`."""
        return [
            f
            for f in self.faults
            if f.step == step
            and f.kind != "slow-host"
            and (f.kind == "spike" or f.host_index(process_count) == process_index)
        ]

    def slow_at(
        self,
        step: int,
        process_index: int,
        process_count: int,
        host: str,
        slow_hosts: dict[str, str],
    ) -> list[FaultSpec]:
        """The slow-host faults that slow this worker at ``step``: one that fired before
        (``slow_hosts``: spec -> the host it hit) slows that host; one that has not, the
        process it names."""
        return [
            f
            for f in self.faults
            if f.kind == "slow-host"
            and f.step <= step
            and (
                slow_hosts[str(f)] == host
                if str(f) in slow_hosts
                else f.host_index(process_count) == process_index
            )
        ]

    def apply(
        self,
        fault: FaultSpec,
        *,
        fast_dir: Path,
        announce: Any,
        batch: Any = None,
        grace_s: float = 30.0,
    ) -> Any:
        """Do ``fault`` in this worker; returns the batch to train on (corrupt for a spike).
        ``announce(fault)`` runs first, so the driver knows it fired even if the process dies."""
        import numpy as np

        announce(fault)
        if fault.kind == "kill-host":
            shutil.rmtree(fast_dir, ignore_errors=True)
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "kill-slice":
            shutil.rmtree(fast_dir, ignore_errors=True)
            drain_slice(f"injected {fault}: the slice is repaired whole")
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "hang":
            time.sleep(HANG_SLEEP_S)
        elif fault.kind == "preempt":
            drain_for_preemption(f"injected {fault}", grace_s)
        elif fault.kind == "spike" and batch is not None:
            rng = np.random.default_rng(fault.step)
            return rng.integers(0, 256, size=np.shape(batch), dtype=np.asarray(batch).dtype)
        return batch


def drain_for_preemption(message: str, grace_s: float) -> None:
    """Drain this worker's Ray node with reason *preemption* and a deadline ``grace_s`` ahead:
    the call ``ray start --block`` makes on SIGTERM (``ray/_private/node.py``) and
    ``ray drain-node`` makes by hand (Ray's developer API: ``GcsClient.drain_node``)."""
    import ray

    _drain([ray.get_runtime_context().get_node_id()], message, grace_s)


def drain_slice(message: str) -> list[str]:
    """Drain every live Ray node of this worker's slice (its ``ray.io/tpu-slice-name`` label)
    with a deadline of now; returns their node ids."""
    import ray

    from raytpu.ray_names import LABEL_SLICE_NAME

    me, nodes = ray.get_runtime_context().get_node_id(), ray.nodes()
    mine = next((n.get("Labels") or {}).get(LABEL_SLICE_NAME) for n in nodes if n["NodeID"] == me)
    if not mine:
        raise RuntimeError(f"kill-slice: node {me} has no {LABEL_SLICE_NAME} label")
    slice_nodes = [
        n["NodeID"]
        for n in nodes
        if n["Alive"] and (n.get("Labels") or {}).get(LABEL_SLICE_NAME) == mine
    ]
    _drain(slice_nodes, message, 0.0)
    return slice_nodes


def _drain(node_ids: list[str], message: str, grace_s: float) -> None:
    from workloads import ray_compat

    ray_compat.drain_nodes(node_ids, message, int(time.time() * 1000 + grace_s * 1000))
