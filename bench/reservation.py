"""Slice reservation on the simulated slice cluster: our module vs Ray's vs a plain placement group.

Starts one local slice cluster (:mod:`workloads.sim.local_cluster`) of ``--cluster-slices`` slices of
v6e 2x4 on 4-chip hosts (2 hosts per slice), then measures, in the same run:

1. **Time to ready**: reserving 1, 2 and 4 whole slices through
   :func:`workloads.slices.reservation.reserve_slices` (all head placement groups at once, slice names
   from the node table, then one label-pinned bundle per host) vs Ray's own
   ``ray.util.tpu.slice_placement_group`` (heads one after another, a task per head to read the
   slice name) vs a plain ``ray.util.placement_group`` with the same bundles and strategy (no
   slice guarantee: the floor); median and range over repeats after one warm-up, and ratios.
2. **Contention**: ``--requests`` concurrent one-slice requests for fewer free slices. A monitor
   samples every node's free TPU and the placement group table throughout and counts samples
   where a slice was *partly* held (some of its hosts' chips taken, not all) and placement groups
   with only part of their bundles placed. Our module must grant whole slices and fail the rest
   with a clear error after its timeout; the plain placement groups show what happens without it.

    python -m bench.reservation [--cluster-slices 4] [--slices 1 2 4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import _common
from raytpu import catalog
from raytpu.ray_names import LABEL_SLICE_NAME
from workloads import ray_compat

STRATEGY = "SPREAD"
"""Ray's ``SlicePlacementGroup`` default, used for the plain placement group too."""


def bench_shape() -> catalog.SliceShape:
    """v6e 2x4 on ct6e-standard-4t: 2 hosts x 4 chips, the smallest multi-host slice."""
    return catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")


def slice_config(shape: catalog.SliceShape, count: int) -> Any:
    from infra.config.schema import SliceConfig

    return SliceConfig(
        name="bench",
        shape=shape,
        zone="us-east5-b",
        count=count,
        provisioning="on-demand",
        reservation=None,
    )


def plain_bundles(shape: catalog.SliceShape, num_slices: int) -> list[dict[str, float]]:
    """The bundles our module asks for: one per host, the host's chips and one CPU."""
    return [
        {"TPU": float(shape.chips_per_host), "CPU": 1.0} for _ in range(shape.hosts * num_slices)
    ]


def total_tpu() -> float:
    import ray

    return float(ray.cluster_resources().get("TPU", 0.0))


def wait_idle(expected_tpu: float, timeout_s: float = 30.0) -> float:
    """Wait until every TPU chip is free again (removal is asynchronous); returns seconds."""
    import ray

    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if float(ray.available_resources().get("TPU", 0.0)) >= expected_tpu:
            return time.monotonic() - began
        time.sleep(0.02)
    raise TimeoutError(
        f"TPU not released within {timeout_s:.0f} s: available "
        f"{ray.available_resources().get('TPU', 0.0)} of {expected_tpu}"
    )


def time_ours(shape: catalog.SliceShape, num_slices: int, timeout_s: float) -> float:
    """Seconds from the request until :func:`reserve_slices` has every bundle placed."""
    from workloads.slices.reservation import reserve_slices

    began = time.perf_counter()
    with reserve_slices(shape, num_slices, timeout_s=timeout_s) as reservation:
        elapsed = time.perf_counter() - began
        if len(reservation.slice_names) != num_slices:
            raise RuntimeError(
                f"reserve_slices gave slices {reservation.slice_names}, wanted {num_slices}"
            )
    return elapsed


def time_ray(shape: catalog.SliceShape, num_slices: int, timeout_s: float) -> float:
    """Seconds until Ray's own ``slice_placement_group`` is ready."""
    from workloads.slices.reservation import ray_native_reservation

    began = time.perf_counter()
    with ray_native_reservation(shape, num_slices, timeout_s=timeout_s):
        elapsed = time.perf_counter() - began
    return elapsed


def time_plain(shape: catalog.SliceShape, num_slices: int, timeout_s: float) -> float:
    """Seconds until a plain placement group with the same bundles is ready."""
    import ray
    from ray.util.placement_group import placement_group

    from workloads.slices.release import remove_placement_groups

    began = time.perf_counter()
    pg = placement_group(plain_bundles(shape, num_slices), strategy=STRATEGY)
    try:
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        elapsed = time.perf_counter() - began
        if not ready:
            raise TimeoutError(f"plain placement group not ready within {timeout_s:.0f} s")
    finally:
        remove_placement_groups([pg])
    return elapsed


# -- contention --------------------------------------------------------------------------------


@dataclass
class MonitorReport:
    samples: int = 0
    partial_slice_samples: int = 0
    """Samples in which some placement group held chips on some, not all, hosts of a slice."""
    max_partial_holders: int = 0
    partial_pg_samples: int = 0
    """Samples in which a placement group had some, not all, of its bundles placed."""
    max_whole_slices_held: int = 0


class SliceMonitor:
    """Samples the placement group table in a thread until stopped.

    For every live placement group, the TPU bundles it has placed are mapped to their host's slice
    (``ray.io/tpu-slice-name`` label): a group holding chips on some but not all hosts of a slice
    is a *partial holder*, the state all-or-nothing reservation must never show.
    """

    def __init__(self, shape: catalog.SliceShape, interval_s: float = 0.05) -> None:
        import ray

        self.shape = shape
        self.interval_s = interval_s
        self.report = MonitorReport()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slice-monitor", daemon=True)
        self._slice_of: dict[str, str] = {}
        for node in ray.nodes():
            labels = node.get("Labels") or {}
            if node.get("Alive") and LABEL_SLICE_NAME in labels:
                self._slice_of[node["NodeID"]] = labels[LABEL_SLICE_NAME]
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def __enter__(self) -> SliceMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def sample(self) -> None:
        partial_holders = 0
        partial_pgs = 0
        whole = 0
        for info in ray_compat.placement_groups().values():
            if info.get("state") == "REMOVED":
                continue
            bundles = info.get("bundles", {})
            placed = {
                index: node
                for index, node in info.get("bundles_to_node_id", {}).items()
                if node and set(node) != {"0"}
            }
            if 0 < len(placed) < len(bundles):
                partial_pgs += 1
            hosts_per_slice: dict[str, set[str]] = {}
            for index, node in placed.items():
                if float(bundles.get(index, {}).get("TPU", 0.0)) > 0:
                    hosts_per_slice.setdefault(self._slice_of.get(node, "?"), set()).add(node)
            for nodes in hosts_per_slice.values():
                if len(nodes) < self.shape.hosts:
                    partial_holders += 1
                else:
                    whole += 1
        with self._lock:
            self._record(partial_holders, partial_pgs, whole)

    def _record(self, partial_holders: int, partial_pgs: int, whole: int) -> None:
        r = self.report
        r.samples += 1
        r.partial_slice_samples += partial_holders > 0
        r.max_partial_holders = max(r.max_partial_holders, partial_holders)
        r.partial_pg_samples += partial_pgs > 0
        r.max_whole_slices_held = max(r.max_whole_slices_held, whole)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as error:  # a monitor sample failing must not hide the benchmark
                self.errors.append(repr(error))
                if len(self.errors) > 20:
                    return
            self._stop.wait(self.interval_s)


@dataclass
class Outcome:
    granted_s: list[float] = field(default_factory=list)
    failed_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    straddling: int = 0
    """Granted requests whose hosts are not exactly the hosts of whole slices."""


def contend_ours(
    shape: catalog.SliceShape, requests: int, timeout_s: float, monitor: SliceMonitor
) -> Outcome:
    """``requests`` concurrent one-slice reservations; holders keep their slice until all ended."""
    from workloads.slices.reservation import SliceReservationError, reserve_slices

    outcome = Outcome()
    lock = threading.Lock()
    finished = threading.Semaphore(0)
    release = threading.Event()
    start = threading.Barrier(requests, timeout=30)

    def one(index: int) -> None:
        start.wait()
        began = time.perf_counter()
        try:
            with reserve_slices(shape, 1, timeout_s=timeout_s, name=f"bench-{index}") as res:
                with lock:
                    outcome.granted_s.append(time.perf_counter() - began)
                    hosts_per_slice = {n: 0 for n in res.slice_names}
                    for host in res.hosts:
                        hosts_per_slice[host.slice_name] = (
                            hosts_per_slice.get(host.slice_name, 0) + 1
                        )
                    if any(c != shape.hosts for c in hosts_per_slice.values()):
                        outcome.straddling += 1
                finished.release()
                release.wait(timeout=timeout_s * 3 + 30)
        except SliceReservationError as error:
            with lock:
                outcome.failed_s.append(time.perf_counter() - began)
                outcome.errors.append(str(error))
            finished.release()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s * 3 + 30
    done = 0
    while done < requests and time.monotonic() < deadline:
        if finished.acquire(timeout=0.5):
            done += 1
    release.set()
    for thread in threads:
        thread.join(timeout=max(1.0, deadline - time.monotonic()))
    if done < requests:
        raise TimeoutError(f"contention: only {done} of {requests} requests ended in time")
    return outcome


def contend_plain(
    shape: catalog.SliceShape, requests: int, timeout_s: float, monitor: SliceMonitor
) -> Outcome:
    """``requests`` plain placement groups of one slice's bundles each, created at once."""
    import ray
    from ray.util.placement_group import placement_group

    from workloads.slices.release import remove_placement_groups

    outcome = Outcome()
    began = time.perf_counter()
    pgs = [placement_group(plain_bundles(shape, 1), strategy=STRATEGY) for _ in range(requests)]
    try:
        pending = {pg.ready(): pg for pg in pgs}
        ready_at: dict[Any, float] = {}
        while pending and time.perf_counter() - began < timeout_s:
            ready, _ = ray.wait(
                list(pending), timeout=max(0.01, timeout_s - (time.perf_counter() - began))
            )
            for ref in ready:
                ready_at[pending.pop(ref)] = time.perf_counter() - began
        monitor.sample()  # one sample with every placed group still held
        labels = {n["NodeID"]: (n.get("Labels") or {}) for n in ray.nodes()}
        for pg, seconds in ready_at.items():
            outcome.granted_s.append(seconds)
            nodes = ray_compat.bundle_nodes(pg).values()
            slices = [labels.get(n, {}).get(LABEL_SLICE_NAME) for n in nodes]
            if len(set(slices)) != 1:
                outcome.straddling += 1
        for _ in pending.values():
            outcome.failed_s.append(timeout_s)
            outcome.errors.append(
                f"(no error: a plain placement group just stays PENDING; gave up after {timeout_s:g} s)"
            )
    finally:
        remove_placement_groups(pgs)
    return outcome


# -- the run ----------------------------------------------------------------------------------


def run(
    *,
    cluster_slices: int,
    slice_counts: Sequence[int],
    repeats: int,
    requests: int,
    timeout_s: float,
) -> dict[str, Any]:
    from workloads.sim.local_cluster import LocalSliceCluster

    for count in slice_counts:
        if not 1 <= count <= cluster_slices:
            raise ValueError(
                f"--slices: {count!r} is not valid; valid: 1..{cluster_slices} (--cluster-slices)"
            )
    if requests <= cluster_slices:
        raise ValueError(
            f"--requests: {requests!r} is not valid; valid: more than --cluster-slices "
            f"({cluster_slices}) so that some requests must fail"
        )
    shape = bench_shape()
    _common.progress(
        f"starting local slice cluster: {cluster_slices} x {shape.name} = "
        f"{cluster_slices * shape.hosts} simulated hosts"
    )
    result: dict[str, Any] = {
        "shape": shape.to_dict(),
        "clusterSlices": cluster_slices,
        "strategy": STRATEGY,
        "timeoutS": timeout_s,
    }
    cluster = LocalSliceCluster([slice_config(shape, cluster_slices)])
    with cluster:
        result["clusterStartS"] = cluster.start_seconds
        _common.progress(f"cluster up in {cluster.start_seconds:.1f} s")
        chips = total_tpu()
        # Warm-up: Ray's path reads a slice's name with a task on its worker 0, which starts a
        # worker process there the first time. Reserve every slice once both ways so no repeat
        # pays for that.
        _common.progress(f"warm-up: reserving all {cluster_slices} slices once")
        result["coldAllSlicesS"] = time_ours(shape, cluster_slices, timeout_s * 4)
        wait_idle(chips)
        time_ray(shape, cluster_slices, timeout_s * 4)
        wait_idle(chips)
        rows = []
        for count in slice_counts:
            samples: dict[str, list[float]] = {"ours": [], "ray": [], "plain": []}
            cold: dict[str, float] = {}
            for rep in range(repeats + 1):  # repeat 0 is a warm-up
                for method, fn in (("ours", time_ours), ("ray", time_ray), ("plain", time_plain)):
                    _common.progress(f"{count} slice(s): {method} repeat {rep}/{repeats}")
                    seconds = fn(shape, count, timeout_s)
                    wait_idle(chips)
                    if rep == 0:
                        cold[method] = seconds
                    else:
                        samples[method].append(seconds)
            ours = _common.summarize(samples["ours"])
            native = _common.summarize(samples["ray"])
            plain = _common.summarize(samples["plain"])
            rows.append(
                {
                    "slices": count,
                    "hosts": count * shape.hosts,
                    "ours": ours,
                    "ray": native,
                    "plain": plain,
                    "speedupVsRay": _common.ratio(native.median, ours.median),
                    "ratio": _common.ratio(ours.median, plain.median),
                    "warmupOursS": cold["ours"],
                    "warmupRayS": cold["ray"],
                    "warmupPlainS": cold["plain"],
                }
            )
        result["timeToReady"] = rows

        contention = {}
        for method, fn in (("ours", contend_ours), ("plain", contend_plain)):
            _common.progress(
                f"contention ({method}): {requests} one-slice requests for {cluster_slices} slices"
            )
            with SliceMonitor(shape) as monitor:
                outcome = fn(shape, requests, timeout_s, monitor)
            wait_idle(chips)
            contention[method] = {
                "requests": requests,
                "granted": len(outcome.granted_s),
                "failed": len(outcome.failed_s),
                "grantS": _common.summarize(outcome.granted_s) if outcome.granted_s else None,
                "failS": _common.summarize(outcome.failed_s) if outcome.failed_s else None,
                "straddling": outcome.straddling,
                "monitor": vars(monitor.report),
                "monitorErrors": monitor.errors[:3],
                "firstError": outcome.errors[0] if outcome.errors else None,
            }
        result["contention"] = contention
    return result


def print_report(result: dict[str, Any]) -> list[str]:
    shape = result["shape"]
    tables = [
        _common.print_table(
            f"Time until the placement group is ready ({shape['generation']} {shape['topology']}, "
            f"{shape['hosts']} hosts x {shape['chipsPerHost']} chips per slice; cluster of "
            f"{result['clusterSlices']} slices started in {result['clusterStartS']:.0f} s, first "
            f"reservation of all slices {_common.fmt_seconds(result['coldAllSlicesS'])}; "
            "median [min..max])",
            (
                "slices",
                "hosts",
                "reserve_slices",
                "Ray slice_placement_group",
                "plain placement_group",
                "Ray / ours",
                "ours / plain",
                "repeats",
                "warm-up (ours/Ray/plain)",
            ),
            [
                (
                    r["slices"],
                    r["hosts"],
                    _common.fmt_stats(r["ours"]),
                    _common.fmt_stats(r["ray"]),
                    _common.fmt_stats(r["plain"]),
                    _common.fmt_ratio(r["speedupVsRay"]),
                    _common.fmt_ratio(r["ratio"]),
                    r["ours"].n,
                    f"{_common.fmt_seconds(r['warmupOursS'])} / "
                    f"{_common.fmt_seconds(r['warmupRayS'])} / "
                    f"{_common.fmt_seconds(r['warmupPlainS'])}",
                )
                for r in result["timeToReady"]
            ],
        )
    ]
    rows = []
    for method, c in result["contention"].items():
        m = c["monitor"]
        rows.append(
            (
                "reserve_slices" if method == "ours" else "plain placement_group",
                f"{c['requests']} for {result['clusterSlices']}",
                c["granted"],
                c["failed"],
                c["straddling"],
                f"{m['partial_slice_samples']}/{m['samples']}",
                f"{m['partial_pg_samples']}/{m['samples']}",
                _common.fmt_seconds(c["grantS"].median) if c["grantS"] else "-",
                _common.fmt_stats(c["failS"]) if c["failS"] else "-",
            )
        )
    tables.append(
        _common.print_table(
            f"Contention: one-slice requests for fewer slices (timeout {result['timeoutS']:g} s)",
            (
                "method",
                "requests",
                "granted",
                "failed",
                "granted across slices",
                "samples w/ a part-slice holder",
                "samples w/ partial PG",
                "grant p50",
                "time to failure",
            ),
            rows,
        )
    )
    ours_error = result["contention"]["ours"]["firstError"]
    if ours_error:
        print(f"reserve_slices failure message: {ours_error}")
    for line in verdicts(result):
        print(line)
    return tables


GOAL_SPEEDUP = 5.0
"""``reserve_slices`` should be at least this much faster than Ray's own call at the most slices."""


def verdicts(result: dict[str, Any]) -> list[str]:
    """``ok``/``FAIL`` lines for the two goals: speed vs Ray's call at the largest slice count,
    and no sample in which ``reserve_slices`` held part of a slice under contention."""
    largest = max(result["timeToReady"], key=lambda r: r["slices"])
    speedup = largest["speedupVsRay"]
    ours = result["contention"]["ours"]
    partial = ours["monitor"]["partial_slice_samples"] + ours["straddling"]
    return [
        f"{'ok' if speedup >= GOAL_SPEEDUP else 'FAIL'}: {speedup:.1f}x faster than Ray's "
        f"slice_placement_group at {largest['slices']} slices (goal >= {GOAL_SPEEDUP:g}x)",
        f"{'ok' if partial == 0 else 'FAIL'}: {partial} contention samples or grants where "
        "reserve_slices held part of a slice (goal 0)",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reservation", description=__doc__)
    parser.add_argument("--cluster-slices", type=int, default=4)
    parser.add_argument("--slices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds a request may wait")
    args = parser.parse_args(argv)
    result = run(
        cluster_slices=args.cluster_slices,
        slice_counts=args.slices,
        repeats=args.repeats,
        requests=args.requests,
        timeout_s=args.timeout,
    )
    print_report(result)
    print(_common.machine_line())
    _common.write_results("reservation", result)
    return 1 if any(line.startswith("FAIL") for line in verdicts(result)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
