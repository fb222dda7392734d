"""Every Ray name this project uses outside Ray's stable API, in one module.

Ray marks parts of its API *alpha* (may change in any release: the TPU slice API ``ray.util.tpu``,
label selectors), *developer* (``DeveloperAPI``: for libraries, with less notice) or leaves them
private (``ray._private``, ``ray._raylet``, generated protobufs). The project pins one Ray
(:data:`raytpu.ray_versions.PINNED_RAY_VERSION`) and runs its slice workloads under every release
of :data:`raytpu.ray_versions.TESTED_RAY_VERSIONS` (``tools/ray_matrix.py``, the
``ray-upgrade.yml`` workflow); each use goes through a function here, and :data:`PATHS` says which
Ray name it reaches and from which release Ray has it. ``tests/test_ray_compat.py`` checks that no
other module reaches those names, and that the policy floor
(:data:`raytpu.ray_versions.MINIMUM_RAY_VERSION`) is no older than any path here needs.

The node label keys Ray's TPU support sets (``ray.io/tpu-slice-name`` ...) are names, not calls:
:mod:`raytpu.ray_names` holds them (stdlib only, for the policy pack and the stack config too).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RayPath:
    """One Ray name outside the stable API that this module reaches."""

    name: str
    """Where it lives in Ray (``ray.util.tpu.slice_placement_group``)."""
    stability: str
    """``alpha``, ``developer`` or ``private``, as Ray marks it."""
    since: str
    """The first Ray release that has it in the form used here."""
    used_for: str


PATHS: tuple[RayPath, ...] = (
    RayPath(
        "ray.util.tpu.slice_placement_group",
        "alpha",
        "2.55.0",
        "Ray's own whole-slice reservation: the baseline bench.reservation compares with",
    ),
    RayPath(
        "ray.util.tpu.get_chips_per_host, get_num_chips_from_topology",
        "alpha",
        "2.55.0",
        "whether Ray's own slice reservation would split a slice of 4-chip hosts",
    ),
    RayPath(
        "ray.util.placement_group.placement_group(bundle_label_selector=...)",
        "alpha",
        "2.55.0",
        "bundles pinned to one slice's hosts by their labels (the reservation's two steps)",
    ),
    RayPath(
        "ray.util.placement_group_table",
        "developer",
        "2.0.0",
        "where each bundle landed; a group's state; who holds a slice",
    ),
    RayPath(
        "ray.train.ScalingConfig(use_tpu=True, topology=..., accelerator_type=...)",
        "alpha",
        "2.55.0",
        "JaxTrainer over every host of the reserved slices",
    ),
    RayPath(
        "ray.train.FailureConfig(max_preemption_failures=...)",
        "alpha",
        "2.58.0",
        "no retry by Ray Train on preemption (this project restarts the run itself); left out "
        "on older releases, where a preemption counts against max_failures (also 0)",
    ),
    RayPath(
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (ray.train.v2._internal.constants)",
        "private",
        "2.55.0",
        "the bound on a JaxTrainer worker group's start",
    ),
    RayPath(
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (ray.train.v2._internal.constants)",
        "private",
        "2.55.0",
        "how often Ray Train's controller polls its workers (bench.training's option)",
    ),
    RayPath(
        "ray_actor_options label_selector (Serve deployments)",
        "alpha",
        "2.55.0",
        "Serve replicas only on hosts of the serving slice's shape",
    ),
    RayPath(
        "ray._raylet.GcsClient.drain_node, ray.core.generated.autoscaler_pb2.DrainNodeReason",
        "developer",
        "2.10.0",
        "a preemption notice, as `ray start --block` gives on SIGTERM (fault injection)",
    ),
    RayPath(
        "ray._private.state.state.get_draining_nodes, "
        "ray.core.generated.common_pb2.NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED",
        "private",
        "2.10.0",
        "the simulated node pool: which hosts are draining or were preempted",
    ),
    RayPath(
        "ray._raylet.Config.initialize, AuthenticationTokenLoader.reset_cache",
        "private",
        "2.52.0",
        "a local cluster with token authentication in a process that imported Ray before",
    ),
    RayPath(
        "ray.cluster_utils.Cluster",
        "developer",
        "1.0.0",
        "the simulated slice cluster: a head and one Ray node per TPU host on this machine",
    ),
)

WORKER_GROUP_START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
"""Ray Train v2's bound on starting the worker group (default 60 s, then it retries), read from
the environment (and passed on to its controller)."""
HEALTH_CHECK_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
"""Ray Train v2's controller poll interval (default 2 s); it also drains the workers' one-slot
result queues, which bounds how often ``ray.train.report`` can return."""


# --- the TPU slice API (ray.util.tpu, alpha) ---------------------------------------------------


def slice_placement_group(
    topology: str, accelerator_version: str, chips_per_host: int, num_slices: int, timeout_s: float
) -> Any:
    """Ray's own ``SlicePlacementGroup``: ``num_slices`` whole slices, one bundle per host."""
    from ray.util.tpu import slice_placement_group as ray_slice_placement_group

    return ray_slice_placement_group(
        topology,
        accelerator_version,
        resources_per_bundle={"TPU": chips_per_host, "CPU": 1},
        num_slices=int(num_slices),
        chips_per_vm=chips_per_host,
        head_reservation_timeout_s=timeout_s,
    )


def ray_guesses_one_host(topology: str, accelerator_version: str) -> bool:
    """Whether Ray, left to guess chips per host, takes ``topology`` for a single host."""
    from ray.util.tpu import get_chips_per_host, get_num_chips_from_topology

    return get_num_chips_from_topology(topology) <= get_chips_per_host(
        topology, accelerator_version
    )


# --- placement groups --------------------------------------------------------------------------


def labeled_placement_group(
    bundles: Sequence[Mapping[str, float]],
    selectors: Sequence[Mapping[str, str]],
    strategy: str,
    name: str = "",
) -> Any:
    """A placement group whose bundle *i* lands only on a node with the labels ``selectors[i]``."""
    from ray.util.placement_group import placement_group

    return placement_group(
        [dict(b) for b in bundles],
        strategy=strategy,
        name=name,
        bundle_label_selector=[dict(s) for s in selectors],
    )


def placement_group_info(pg: Any) -> dict[str, Any]:
    """Ray's record of one placement group (``state``, ``bundles_to_node_id``, ...)."""
    from ray.util import placement_group_table

    return placement_group_table(pg)


def placement_groups() -> dict[str, dict[str, Any]]:
    """Ray's record of every placement group of the cluster, by id (hex)."""
    from ray.util import placement_group_table

    return placement_group_table()


def bundle_nodes(pg: Any) -> dict[int, str]:
    """Bundle index -> the node id it landed on (only placed bundles)."""
    return dict(placement_group_info(pg).get("bundles_to_node_id", {}))


# --- Ray Train and Serve ----------------------------------------------------------------------


def tpu_scaling_config(
    num_workers: int,
    topology: str,
    accelerator_type: str,
    resources_per_worker: Mapping[str, float],
) -> Any:
    """``ScalingConfig`` for a JaxTrainer on TPU hosts (one worker per host)."""
    import ray.train

    return ray.train.ScalingConfig(
        use_tpu=True,
        num_workers=num_workers,
        topology=topology,
        accelerator_type=accelerator_type,
        resources_per_worker=dict(resources_per_worker),
    )


def no_retries_failure_config() -> Any:
    """Ray Train's ``FailureConfig`` that retries nothing, preemptions included where this Ray
    has ``max_preemption_failures`` (2.58 on)."""
    import ray.train

    kwargs = {"max_failures": 0, "controller_failure_limit": 0}
    if "max_preemption_failures" in inspect.signature(ray.train.FailureConfig).parameters:
        kwargs["max_preemption_failures"] = 0
    return ray.train.FailureConfig(**kwargs)


def label_selector_options(labels: Mapping[str, str]) -> dict[str, Any]:
    """Actor options that keep an actor (a Serve replica) on nodes with ``labels``."""
    return {"label_selector": dict(labels)}


# --- nodes: drains and preemptions -------------------------------------------------------------


def drain_nodes(node_ids: Sequence[str], message: str, deadline_ms: int) -> None:
    """Drain each node with reason *preemption* and a deadline: the call ``ray start --block``
    makes on SIGTERM and ``ray drain-node`` makes by hand. Raises if the GCS refuses one."""
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)
    reason = autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION")
    for node_id in node_ids:
        accepted, rejection = gcs.drain_node(node_id, reason, message, deadline_ms)
        if not accepted:
            raise RuntimeError(f"drain of node {node_id} refused by the GCS: {rejection}")


def draining_nodes() -> dict[str, int]:
    """Node id -> its drain deadline (ms since the epoch; 0 for none) of every draining node."""
    from ray._private import state

    return dict(state.state.get_draining_nodes())


def preempted_by_drain(node: Mapping[str, Any]) -> bool:
    """Whether a dead node of ``ray.nodes()`` exited because it was drained for preemption."""
    from ray.core.generated.common_pb2 import NodeDeathInfo

    return node.get("DeathReason") == NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED


# --- local clusters ----------------------------------------------------------------------------


def reload_auth() -> None:
    """Ray caches its config and token at import: make this process see the current env."""
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def local_cluster(head_node_args: Mapping[str, Any]) -> Any:
    """A Ray cluster of processes on this machine with its head started (``Cluster.add_node``
    adds a node; ``Cluster.shutdown`` removes them all)."""
    from ray.cluster_utils import Cluster

    return Cluster(initialize_head=True, head_node_args=dict(head_node_args))
