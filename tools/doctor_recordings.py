"""``python -m tools.doctor_recordings KUBERAY_CHECKOUT``: rebuild tests/data/doctor/.

Writes one folder per scenario, each holding what ``kubectl get <kind> -o json`` answers on the
dev stack's cluster (``raytpu doctor --recorded``): the Ray objects, pods and nodes that the dev
stack's declaration (under mocks, ray-tpu:imageTag = :data:`TAG`) makes, in the shapes KubeRay
and the TPU webhook give them, and the KubeRay CRDs abridged from a KubeRay git checkout at two
release tags: property names and types down to the fields doctor reads, deeper subtrees kept as
``x-kubernetes-preserve-unknown-fields`` (the full CRDs are megabytes). Run it again when the dev
stack's Ray objects change; ``tests/test_doctor.py`` fails until then.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "doctor"
TAG = "5f1c2e9a7b3d"
"""The ray-tpu:imageTag the recorded cluster was deployed with."""
OLD_TAG = "1a2b3c4d5e6f"
"""The tag of the deploy before it (what a stale RayCluster still runs)."""
NEW_KUBERAY, OLD_KUBERAY = "v1.7.0", "v1.5.0"
KEEP = {"authOptions", "upgradeStrategy", "rayClusterConfig", "rayClusterSpec"}
"""Spec fields kept in full depth; every other field keeps its name and type only."""
SERVE_CLUSTER = "serve-x7k2p"
NS = "ray"


def _abridge(schema: dict[str, Any], depth: int) -> dict[str, Any]:
    kept: dict[str, Any] = {k: schema[k] for k in ("type", "enum") if k in schema}
    if "properties" in schema and depth > 0:
        kept["properties"] = {
            name: _abridge(sub, depth + 1 if name in KEEP else depth - 1)
            for name, sub in schema["properties"].items()
        }
    elif "properties" in schema or "items" in schema or schema.get("type") == "object":
        if schema.get("type") == "array":
            kept["items"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        else:
            kept["x-kubernetes-preserve-unknown-fields"] = True
    return kept


def crd(checkout: Path, tag: str, plural: str, uid: int) -> dict[str, Any]:
    path = f"ray-operator/config/crd/bases/ray.io_{plural}.yaml"
    text = subprocess.run(
        ["git", "-C", str(checkout), "show", f"{tag}:{path}"], capture_output=True, check=True
    ).stdout
    full = yaml.safe_load(text)
    for version in full["spec"]["versions"]:
        root = version["schema"]["openAPIV3Schema"]
        spec = _abridge(root["properties"]["spec"], 1)
        status = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        version["schema"]["openAPIV3Schema"] = {
            "type": "object",
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "metadata": {"type": "object"}, "spec": spec, "status": status},
        }  # fmt: skip
        version.pop("additionalPrinterColumns", None)
    full["metadata"].update(_meta(full["metadata"]["name"], None, uid))
    full["status"] = {"acceptedNames": full["spec"]["names"], "storedVersions": ["v1"]}
    return full


def _meta(name: str, namespace: str | None, uid: int, **extra: Any) -> dict[str, Any]:
    meta = {
        "name": name,
        "uid": f"6f0c1d2e-0000-4000-8000-{uid:012d}",
        "resourceVersion": str(1734000000 + uid),
        "creationTimestamp": "2026-12-01T09:00:00Z",
        **extra,
    }
    if namespace:
        meta["namespace"] = namespace
    return meta


def _ints(value: Any) -> Any:
    """Props as the engine holds them (numbers as floats) back to JSON's integers."""
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def List(items: list[dict[str, Any]], api: str = "v1") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "List", "items": items, "metadata": {"resourceVersion": ""}}


def declared() -> tuple[list[Any], dict[str, Any]]:
    from infra import offline
    from infra.config.stack import load_stack

    return offline.run_program(load_stack("dev", image_tag=TAG), stack="dev")


def ray_objects(resources: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """The live RayCluster and RayService: the declared objects plus what KubeRay writes."""
    found: dict[str, list[dict[str, Any]]] = {"RayCluster": [], "RayService": [], "RayJob": []}
    for uid, r in enumerate(r for r in resources if r.type.startswith("kubernetes:ray.io/")):
        obj = _ints(r.props)
        name = obj["metadata"]["name"]
        obj["metadata"] = _meta(name, NS, 100 + uid, generation=1,
                                labels=obj["metadata"].get("labels", {}))  # fmt: skip
        kind = obj["kind"]
        if kind == "RayCluster":
            obj["spec"]["workerGroupSpecs"][0]["replicas"] = 1  # the autoscaler scaled it up
            obj["status"] = _cluster_status(name, 2)
        else:
            obj["status"] = _service_status(name)
        found[kind].append(obj)
    return found


def _cluster_status(name: str, workers: int) -> dict[str, Any]:
    return {
        "state": "ready",
        "readyWorkerReplicas": workers,
        "availableWorkerReplicas": workers,
        "desiredWorkerReplicas": workers,
        "minWorkerReplicas": 0,
        "maxWorkerReplicas": workers,
        "desiredTPU": str(4 * workers),
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379",
                      "metrics": "8080"},
        "head": {"podName": f"{name}-head-q8h2m", "serviceName": f"{name}-head-svc",
                 "podIP": "10.8.0.12", "serviceIP": "10.8.0.12"},
        "conditions": [
            {"type": "RayClusterProvisioned", "status": "True", "reason": "AllPodRunningAndReadyFirstTime",
             "lastTransitionTime": "2026-12-01T09:04:00Z", "message": "All Ray Pods are ready for the first time"},
            {"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady",
             "lastTransitionTime": "2026-12-01T09:02:00Z", "message": ""},
        ],
        "observedGeneration": 1,
        "lastUpdateTime": "2026-12-01T09:04:00Z",
    }  # fmt: skip


def _service_status(name: str) -> dict[str, Any]:
    app = {"status": "RUNNING", "serveDeploymentStatuses": {"TextGenerator": {"status": "HEALTHY"}}}
    return {
        "serviceStatus": "Running",
        "numServeEndpoints": 1,
        "activeServiceStatus": {"rayClusterName": SERVE_CLUSTER, "applicationStatuses": {name: app},
                                "rayClusterStatus": _cluster_status(SERVE_CLUSTER, 1)},
        "pendingServiceStatus": {},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints",
             "lastTransitionTime": "2026-12-01T09:06:00Z", "message": "Number of serve endpoints is greater than 0"},
            {"type": "UpgradeInProgress", "status": "False", "reason": "NoPendingCluster",
             "lastTransitionTime": "2026-12-01T09:06:00Z", "message": "Active Ray cluster exists and no pending Ray cluster"},
        ],
        "observedGeneration": 1,
    }  # fmt: skip


def _auth_env(cluster_spec: dict[str, Any], cluster: str) -> list[dict[str, Any]]:
    """What KubeRay adds to each Ray container for authOptions.mode token."""
    options = cluster_spec.get("authOptions") or {}
    if options.get("mode") != "token":
        return []
    env: list[dict[str, Any]] = [{"name": "RAY_AUTH_MODE", "value": "token"}]
    if options.get("enableK8sTokenAuth"):
        return [*env, {"name": "RAY_ENABLE_K8S_TOKEN_AUTH", "value": "true"}]
    secret = options.get("secretName") or cluster
    ref = {"secretKeyRef": {"name": secret, "key": "auth_token"}}
    return [*env, {"name": "RAY_AUTH_TOKEN", "valueFrom": ref}]


def _pod(owner: dict[str, Any], cluster: str, group: str, suffix: str, node: str,
         webhook: dict[str, Any] | None, uid: int) -> dict[str, Any]:  # fmt: skip
    spec_path = (
        owner["spec"] if owner["kind"] == "RayCluster" else owner["spec"]["rayClusterConfig"]
    )
    if group == "headgroup":
        template = spec_path["headGroupSpec"]["template"]
        node_type, name = "head", f"{cluster}-head-{suffix}"
    else:
        template = spec_path["workerGroupSpecs"][0]["template"]
        node_type, name = "worker", f"{cluster}-{group}-worker-{suffix}"
    pod_spec = json.loads(json.dumps(template["spec"]))
    kuberay_env = [{"name": "RAY_CLUSTER_NAME", "value": cluster},
                   {"name": "RAY_CLUSTER_NAMESPACE", "value": NS}]  # fmt: skip
    for container in pod_spec["containers"]:
        container["env"] = [*container.get("env", []), *kuberay_env,
                            *_auth_env(spec_path, cluster), *(webhook or {}).get("env", [])]  # fmt: skip
    pod_labels = {**template["metadata"].get("labels", {}), "ray.io/cluster": cluster,
                  "ray.io/group": group, "ray.io/node-type": node_type, "ray.io/is-ray-node": "yes",
                  "ray.io/identifier": f"{cluster}-{node_type}",
                  "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator"}  # fmt: skip
    if webhook:
        pod_labels["replicaIndex"] = webhook["replica"]
        pod_spec.update(webhook.get("spec", {}))
    pod_spec["nodeName"] = node
    image = pod_spec["containers"][0]["image"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(name, NS, uid, generateName=name[: -len(suffix)], labels=pod_labels,
                          ownerReferences=[{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster,
                                            "uid": f"6f0c1d2e-0000-4000-8000-{uid + 900:012d}",
                                            "controller": True, "blockOwnerDeletion": True}]),
        "spec": pod_spec,
        "status": {"phase": "Running", "podIP": f"10.8.1.{uid % 250}", "hostIP": f"10.0.0.{uid % 250}",
                   "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T09:03:00Z"}],
                   "containerStatuses": [{"name": pod_spec["containers"][0]["name"], "ready": True,
                                          "image": image, "restartCount": 0, "started": True,
                                          "state": {"running": {"startedAt": "2026-12-01T09:02:30Z"}}}]},
    }  # fmt: skip


def _tpu_webhook(group: str, replica: int, worker: int, hosts: int, cluster: str) -> dict[str, Any]:
    """What the TPU webhook patches into a TPU pod (hostnames only for multi-host slices)."""
    env = [{"name": "TPU_WORKER_ID", "value": str(worker)},
           {"name": "TPU_NAME", "value": f"{group}-{replica}"}]  # fmt: skip
    found: dict[str, Any] = {"replica": f"{group}-{replica}", "env": env}
    if hosts > 1:
        subdomain = f"{cluster}-headless-worker-svc"
        names = ",".join(f"{group}-{replica}-{j}.{subdomain}" for j in range(hosts))
        env.insert(0, {"name": "TPU_WORKER_HOSTNAMES", "value": names})
        found["spec"] = {"hostname": f"{group}-{replica}-{worker}", "subdomain": subdomain}
    return found


def nodes(outputs: dict[str, Any]) -> list[dict[str, Any]]:
    found = [_node("gke-ray-tpu-dev-cpu-3f9a1c2b-7kxq", "cpu", "n2-standard-8", {}, 1)]
    for uid, (slice_name, s) in enumerate(sorted(outputs["slices"].items())):
        pool = s["nodePools"][0]
        tpu = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
               "cloud.google.com/gke-tpu-topology": s["topology"], "cloud.google.com/gke-spot": "true"}  # fmt: skip
        for host in range(s["hosts"]):
            name = f"gke-ray-tpu-dev-{pool}-{slice_name[:2]}{uid}c4e8d1-{'abcd'[host]}x{host}q"
            found.append(_node(name, pool, s["machineType"], tpu, 10 + 10 * uid + host))
    return found


def _node(name: str, pool: str, machine: str, extra: dict[str, str], uid: int) -> dict[str, Any]:
    node_labels = {"cloud.google.com/gke-nodepool": pool, "kubernetes.io/hostname": name,
                   "node.kubernetes.io/instance-type": machine, "topology.kubernetes.io/zone": "us-east5-b",
                   "topology.kubernetes.io/region": "us-east5", **extra}  # fmt: skip
    capacity = {"cpu": "8", "memory": "32863468Ki", "pods": "110"}
    if extra:
        capacity.update({"google.com/tpu": "4", "cpu": "180", "memory": "743926380Ki"})
    return {"apiVersion": "v1", "kind": "Node", "metadata": _meta(name, None, 500 + uid, labels=node_labels),
            "spec": {"providerID": f"gce://ray-tpu-dev/us-east5-b/{name}"},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}}  # fmt: skip


def webhooks(with_tpu: bool) -> list[dict[str, Any]]:
    ns_selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                         "values": ["kube-system", "kube-node-lease"]}]}  # fmt: skip
    cert_manager = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": _meta("cert-manager-webhook", None, 700),
        "webhooks": [{"name": "webhook.cert-manager.io", "admissionReviewVersions": ["v1"],
                      "sideEffects": "None", "failurePolicy": "Fail", "matchPolicy": "Equivalent",
                      "clientConfig": {"service": {"name": "cert-manager-webhook", "namespace": "cert-manager",
                                                   "path": "/mutate", "port": 443}},
                      "rules": [{"apiGroups": ["cert-manager.io", "acme.cert-manager.io"], "apiVersions": ["v1"],
                                 "operations": ["CREATE"], "resources": ["*/*"], "scope": "*"}]}],
    }  # fmt: skip
    tpu = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": _meta("kuberay-tpu-mutating-webhook-cfg", None, 701),
        "webhooks": [{"name": "kuberay-tpu-webhook.ray-system.svc", "admissionReviewVersions": ["v1"],
                      "sideEffects": "NoneOnDryRun", "failurePolicy": "Fail", "matchPolicy": "Equivalent",
                      "namespaceSelector": ns_selector,
                      "objectSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay"}},
                      "clientConfig": {"service": {"name": "kuberay-tpu-webhook", "namespace": "ray-system",
                                                   "path": "/mutate", "port": 443}},
                      "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                 "resources": ["pods"], "scope": "Namespaced"}]}],
    }  # fmt: skip
    return [cert_manager, tpu] if with_tpu else [cert_manager]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from tools.doctor_scenarios import write_all

    write_all(Path(sys.argv[1]), OUT)
