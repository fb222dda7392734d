"""The scenarios of tests/data/doctor/ (see :mod:`tools.doctor_recordings`): a healthy dev
cluster, and one fault each on top of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.doctor_recordings import (
    NEW_KUBERAY,
    OLD_KUBERAY,
    OLD_TAG,
    SERVE_CLUSTER,
    TAG,
    List,
    _pod,
    _tpu_webhook,
    crd,
    declared,
    nodes,
    ray_objects,
    webhooks,
)

PLURALS = ("rayclusters", "rayjobs", "rayservices")


def _pods(objects: dict[str, list[dict[str, Any]]], all_nodes: list[dict[str, Any]],
          with_webhook: bool) -> list[dict[str, Any]]:  # fmt: skip
    by_pool: dict[str, list[str]] = {}
    for node in all_nodes:
        pool = node["metadata"]["labels"]["cloud.google.com/gke-nodepool"]
        by_pool.setdefault(pool, []).append(node["metadata"]["name"])
    (train,) = objects["RayCluster"]
    (serve,) = objects["RayService"]
    found = []
    for uid, (owner, cluster, pool, hosts) in enumerate(
        ((train, "train", "train-0", 2), (serve, SERVE_CLUSTER, "serve-0", 1))
    ):
        found.append(_pod(owner, cluster, "headgroup", "q8h2m", by_pool["cpu"][0], None, 200 + uid))
        for worker in range(hosts):
            hook = _tpu_webhook("tpu-group", 0, worker, hosts, cluster) if with_webhook else None
            suffix = f"{'kt' if uid == 0 else 'sv'}{worker}zp"
            found.append(
                _pod(
                    owner,
                    cluster,
                    "tpu-group",
                    suffix,
                    by_pool[pool][worker],
                    hook,
                    210 + 10 * uid + worker,
                )
            )
    return found


def build(checkout: Path, *, kuberay: str = NEW_KUBERAY, tpu_webhook: bool = True) -> dict:
    resources, outputs = declared()
    objects = ray_objects(resources)
    all_nodes = nodes(outputs)
    return {
        "crds": List([crd(checkout, kuberay, p, 800 + i) for i, p in enumerate(PLURALS)]),
        "mutatingwebhookconfigurations": List(webhooks(tpu_webhook)),
        "rayclusters": List(objects["RayCluster"]),
        "rayservices": List(objects["RayService"]),
        "rayjobs": List(objects["RayJob"]),
        "pods": List(_pods(objects, all_nodes, tpu_webhook)),
        "nodes": List(all_nodes),
    }


def _env(pod: dict[str, Any], name: str, value: str) -> None:
    for var in pod["spec"]["containers"][0]["env"]:
        if var["name"] == name:
            var["value"] = value


def duplicate_worker_ids(answers: dict) -> None:
    """The webhook's known fault: both hosts of the train slice got TPU_WORKER_ID 0."""
    second = next(p for p in answers["pods"]["items"] if p["metadata"]["name"].endswith("kt1zp"))
    _env(second, "TPU_WORKER_ID", "0")
    second["spec"]["hostname"] = "tpu-group-0-0"


def old_kuberay(answers: dict) -> None:
    """KubeRay v1.5.0 serves no authOptions: the API server dropped it, KubeRay set no auth."""
    for kind in ("rayclusters", "rayservices"):
        for obj in answers[kind]["items"]:
            spec = obj["spec"] if kind == "rayclusters" else obj["spec"]["rayClusterConfig"]
            spec.pop("authOptions", None)
    for pod in answers["pods"]["items"]:
        for container in pod["spec"]["containers"]:
            container["env"] = [e for e in container["env"] if not e["name"].startswith("RAY_AUTH")
                                and e["name"] != "RAY_ENABLE_K8S_TOKEN_AUTH"]  # fmt: skip


def stale_image(answers: dict) -> None:
    """The RayCluster's pods still run the previous deploy's image (KubeRay does not roll)."""
    for pod in answers["pods"]["items"]:
        if pod["metadata"]["labels"]["ray.io/cluster"] != "train":
            continue
        for container in (*pod["spec"]["containers"], *pod["status"]["containerStatuses"]):
            container["image"] = container["image"].replace(TAG, OLD_TAG)


SCENARIOS: dict[str, tuple[dict[str, Any], Callable[[dict], None] | None]] = {
    "healthy": ({}, None),
    "duplicate-worker-ids": ({}, duplicate_worker_ids),
    "old-kuberay": ({"kuberay": OLD_KUBERAY}, old_kuberay),
    "stale-image": ({}, stale_image),
    "missing-webhook": ({"tpu_webhook": False}, None),
}


def write_all(checkout: Path, out: Path) -> None:
    for scenario, (options, fault) in SCENARIOS.items():
        answers = build(checkout, **options)
        if fault is not None:
            fault(answers)
        folder = out / scenario
        folder.mkdir(parents=True, exist_ok=True)
        for name, answer in answers.items():
            (folder / f"{name}.json").write_text(json.dumps(answer, indent=2) + "\n")
        print(f"{folder}: {', '.join(answers)}")
