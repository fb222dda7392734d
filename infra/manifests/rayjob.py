"""Pure builder of the KubeRay ``RayJob`` that runs training from the stack (no pulumi import).

Glossary (KubeRay's and Ray's words):

- **RayJob**: KubeRay creates a RayCluster from ``rayClusterSpec`` (here the same spec as a
  RayCluster on that slice: :func:`infra.manifests.kuberay.ray_cluster_spec`, from the catalog record),
  submits ``entrypoint`` with ``runtimeEnvYAML`` and, with ``shutdownAfterJobFinishes``, deletes
  the cluster ``ttlSecondsAfterFinished`` seconds after the job ends, which frees the slice.
- **submissionMode** ``K8sJobMode``: a Kubernetes Job runs ``ray job submit`` against the new
  head; it retries while the head starts, so no one waits on a laptop.
- **runtime env**: the code and packages come from the worker image (see the Dockerfile, which
  installs this project and ``jax[tpu]``); the runtime env adds environment variables only, so
  the job starts without installing anything on the TPU hosts.
- **run name**: a RayJob runs what it was created with; KubeRay passes no later spec change on
  to its RayCluster. So the object is named ``<job>-<digest of its spec, images left out>``
  (:func:`run_name`): a deploy that only bumps the image leaves a running job alone (the
  component ignores spec changes), and a changed job is a new RayJob under a new name, the old
  one left to finish (:mod:`infra.components.ray_object`).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Any

import yaml

from infra.config.schema import RayJobConfig, StackConfig
from infra.manifests import kuberay
from raytpu import entrypoints

__all__ = [
    "SUBMISSION_MODE",
    "entrypoint",
    "ray_job_object",
    "ray_job_spec",
    "run_name",
    "runtime_env",
]

SUBMISSION_MODE = "K8sJobMode"
RUN_DIGEST_CHARS = 6
"""A config name of at most 40 characters, ``-`` and 6 hex digits: KubeRay's 47-character
RayJob name limit (53 for a RayCluster, less the 6 it appends)."""


def entrypoint(stack: StackConfig, job: RayJobConfig) -> str:
    """The job's command: ``job.entrypoint``, else training sized to the job's slices."""
    if job.entrypoint:
        return job.entrypoint
    shape = stack.slice(job.slice).shape
    return shlex.join(entrypoints.train_command(shape, job.replicas, job.args))


def runtime_env(stack_name: str, stack: StackConfig, job: RayJobConfig) -> dict[str, Any]:
    """``job.runtime_env`` with the slice's environment variables and the run's checkpoint
    directory (``gs://<bucket>/<job name>``) added (the job's own ``env_vars`` win)."""
    env = kuberay.plain(job.runtime_env)
    shape = stack.slice(job.slice).shape
    env_vars = entrypoints.slice_env(stack_name, job.name, job.slice, shape)
    if stack.storage is not None:
        # Training run <job name>: its checkpoints go to gs://BUCKET/<job name>.
        env_vars[entrypoints.CHECKPOINT_ENV] = entrypoints.checkpoint_uri(
            stack.storage.bucket, job.name
        )
    env_vars.update(env.get("env_vars", {}))
    env["env_vars"] = env_vars
    return env


def ray_job_spec(stack: StackConfig, job: RayJobConfig, *, stack_name: str = "") -> dict[str, Any]:
    """``spec`` of the RayJob ``job``; validates against the KubeRay RayJob CRD."""
    spec: dict[str, Any] = {
        "entrypoint": entrypoint(stack, job),
        "runtimeEnvYAML": yaml.safe_dump(runtime_env(stack_name, stack, job), sort_keys=True),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": job.ttl_seconds_after_finished,
        "submissionMode": SUBMISSION_MODE,
        "rayClusterSpec": kuberay.ray_cluster_spec(
            stack, job.cluster, "RayJob", stack_name=stack_name
        ),
    }
    if job.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = job.active_deadline_seconds
    return spec


def _without_images(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_images(v) for k, v in value.items() if k != "image"}
    if isinstance(value, list):
        return [_without_images(v) for v in value]
    return value


def run_name(job: RayJobConfig, spec: dict[str, Any]) -> str:
    """The RayJob's Kubernetes name: the job's name and a digest of what it runs (``spec``
    without its container images), so that only a change of what runs makes a new run."""
    text = json.dumps(_without_images(spec), sort_keys=True, separators=(",", ":"))
    return f"{job.name}-{hashlib.sha256(text.encode()).hexdigest()[:RUN_DIGEST_CHARS]}"


def ray_job_object(
    stack: StackConfig, job: RayJobConfig, *, stack_name: str = ""
) -> dict[str, Any]:
    """The whole RayJob manifest (apiVersion, kind, metadata, spec), named by :func:`run_name`."""
    spec = ray_job_spec(stack, job, stack_name=stack_name)
    metadata = kuberay.metadata(stack, job.cluster)
    return {
        "apiVersion": kuberay.API_VERSION,
        "kind": "RayJob",
        "metadata": {**metadata, "name": run_name(job, spec)},
        "spec": spec,
    }
