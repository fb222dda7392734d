"""Submitting a workload to the Ray cluster that ``pulumi up`` made, through Ray's Job Submission API.

The command and its examples: :mod:`raytpu_cli.submit`.

The stack outputs (``pulumi stack output --json --stack STACK``, or a saved copy given with
``--outputs``) name the Ray clusters, their slices and their head services. The head is reached
at ``--address`` (default http://127.0.0.1:8265) through ``kubectl port-forward``: it is never
exposed publicly.

Glossary (Ray's words):

- **job**: one driver process (the **entrypoint** command) that Ray runs on the head node, with a
  **runtime environment**: the code it needs (``working_dir``: this repository's ``workloads``
  and ``raytpu`` packages) plus, with ``--pip``, the pinned packages (``jax[tpu]``...).
  By default the packages come from the worker image (see the Dockerfile), so a job starts in
  seconds instead of installing libtpu on every host.
- **submission id**: the job id this command prints; ``ray job logs/stop --address ... ID``.
- **train**: ``python -m raytpu_cli train`` sized to the cluster's slice from the stack.
- **serve**: deploys ``workloads.serve:app`` on a RayCluster with ``serve run --non-blocking`` in a
  job (Serve keeps it running after the job ends). A RayService already serves that app from its
  ``serveConfigV2``: change it with ``pulumi up``, not with a job.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytpu import entrypoints, errors, stack_outputs
from raytpu.errors import invalid
from raytpu.ray_names import SERVE_PORT
from raytpu.stack_outputs import RayHead, StackOutputs, StackOutputsError

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_ADDRESS = f"http://127.0.0.1:{stack_outputs.DEFAULT_DASHBOARD_PORT}"
WORKLOADS = ("train", "serve")
SERVE_IMPORT_PATH = entrypoints.SERVE_IMPORT_PATH
WORKING_DIR_PACKAGES = entrypoints.WORKER_PACKAGES
"""Packages shipped in the job's ``working_dir`` (the job's cwd, first on its ``sys.path``)."""
WORKING_DIR_IGNORE = ("__pycache__", "*.pyc", "*.egg-info")
HEAD_CHECK_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
DEFAULT_JOB_TIMEOUT_S = 3600.0
POLL_INTERVAL_S = 1.0


class SubmitError(RuntimeError):
    """A submission that could not be made or did not finish; the message says what to do."""


class HeadRateLimitedError(SubmitError):
    """The head (or a proxy in front of it) answered HTTP 429: retry later."""

    error_class = errors.UPSTREAM_RATE_LIMITED


class HeadUnreachableError(SubmitError):
    """Nothing answers at the address; the message carries the port-forward command."""


class JobTimeoutError(SubmitError):
    """The job did not reach a terminal state within the timeout (it keeps running)."""


@dataclass(frozen=True)
class JobRequest:
    """What is sent to the Job Submission API."""

    workload: str
    """``train``, ``serve`` or ``command`` (any other entrypoint)."""
    entrypoint: str
    runtime_env: Mapping[str, Any]
    submission_id: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SubmitResult:
    """A submitted job, and how it ended when the submission waited for it."""

    job_id: str
    address: str
    head: RayHead
    status: str
    """Ray's ``JobStatus``: PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED."""
    waited: bool
    message: str = ""
    logs: str = ""
    duration_s: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.status == "SUCCEEDED"


# --- choosing the head ------------------------------------------------------------------------


def choose_head(
    outputs: StackOutputs,
    *,
    workload: str,
    cluster: str | None = None,
    slice_name: str | None = None,
) -> RayHead:
    """The Ray head to submit to: ``--cluster``, else the one RayCluster on ``--slice``, else the
    RayCluster named like the workload, else the stack's only RayCluster."""
    if cluster is not None:
        if cluster not in outputs.ray_clusters and cluster in outputs.ray_services:
            service = outputs.ray_service(cluster)
            raise SubmitError(_service_message(service, cluster_hint=outputs))
        head = outputs.ray_cluster(cluster)
        if slice_name is not None and head.slice != slice_name:
            outputs.slice(slice_name)
            raise StackOutputsError(
                invalid("slice", slice_name, head.slice, reason=f"cluster {cluster!r} is not on it")
            )
        return head
    if slice_name is not None:
        on_slice = outputs.clusters_on_slice(slice_name)
        if len(on_slice) == 1:
            return on_slice[0]
        with_clusters = sorted({c.slice for c in outputs.ray_clusters.values()})
        if not on_slice:
            raise StackOutputsError(
                f"slice: {slice_name!r} has no RayCluster in stack {outputs.stack!r}; "
                f"valid: {', '.join(with_clusters) or '(none)'}"
            )
        raise StackOutputsError(
            f"cluster: slice {slice_name!r} has several RayClusters; name one with --cluster; "
            f"valid: {', '.join(sorted(c.name for c in on_slice))}"
        )
    if workload in outputs.ray_clusters:
        return outputs.ray_clusters[workload]
    if len(outputs.ray_clusters) == 1:
        return next(iter(outputs.ray_clusters.values()))
    if not outputs.ray_clusters:
        raise StackOutputsError(
            f"cluster: stack {outputs.stack!r} declares no RayCluster; valid: (none). Add one "
            "under ray-tpu:rayClusters and run pulumi up"
        )
    raise StackOutputsError(
        f"cluster: stack {outputs.stack!r} has several RayClusters; name one with --cluster; "
        f"valid: {', '.join(sorted(outputs.ray_clusters))}"
    )


def serving_service(
    outputs: StackOutputs, workload: str, cluster: str | None, slice_name: str | None
) -> RayHead | None:
    """The RayService that already serves the app when ``serve`` targets one, else None.

    ``serve`` goes to a RayService when ``--cluster`` names one, or when neither ``--cluster``
    nor ``--slice`` is given and no RayCluster is called ``serve``.
    """
    if workload != "serve" or not outputs.ray_services:
        return None
    if cluster is not None:
        return outputs.ray_services.get(cluster) if cluster not in outputs.ray_clusters else None
    if slice_name is not None or "serve" in outputs.ray_clusters:
        return None
    if "serve" in outputs.ray_services:
        return outputs.ray_services["serve"]
    return outputs.ray_services[sorted(outputs.ray_services)[0]]


def _service_message(service: RayHead, cluster_hint: StackOutputs | None = None) -> str:
    lines = [
        f"{service.name!r} is a RayService: KubeRay runs {SERVE_IMPORT_PATH} from its "
        "serveConfigV2 and replaces anything submitted to it. Change it with "
        f"`pulumi up --stack {cluster_hint.stack if cluster_hint else 'STACK'}`; query it with:",
        f"  {service.serve_port_forward_command()}",
        f"  curl -X POST http://127.0.0.1:{SERVE_PORT}/ "
        """-H 'content-type: application/json' -d '{"prompt": "The TPU"}'""",
    ]
    if cluster_hint is not None and cluster_hint.ray_clusters:
        lines.append(
            "To submit a job, pick a RayCluster with --cluster; valid: "
            + ", ".join(sorted(cluster_hint.ray_clusters))
        )
    return "\n".join(lines)


# --- reaching the head ------------------------------------------------------------------------


def _local_port(address: str) -> int:
    from urllib.parse import urlparse

    return urlparse(address).port or stack_outputs.DEFAULT_DASHBOARD_PORT


def check_head(
    address: str,
    head: RayHead,
    *,
    timeout_s: float = HEAD_CHECK_TIMEOUT_S,
    headers: Mapping[str, str] | None = None,
) -> str:
    """The Ray version the head at ``address`` runs; :class:`HeadUnreachableError` if none answers.

    Bounded by ``timeout_s`` (connect and read), so a dead port-forward fails fast.
    """
    import requests

    hint = (
        f"Reach the head of {head.kind} {head.name!r} (namespace {head.namespace!r}) without "
        f"exposing it; in another terminal run:\n  {head.port_forward_command(_local_port(address))}"
        f"\nthen run this command again (or pass --address URL)."
    )
    url = address.rstrip("/") + "/api/version"
    try:
        response = requests.get(url, timeout=timeout_s, headers=dict(headers or {}))
    except requests.exceptions.RequestException as error:
        reason = type(error).__name__
        raise HeadUnreachableError(
            f"Ray head not reachable at {address} ({reason}).\n{hint}"
        ) from error
    if response.status_code in (401, 403):
        how = (
            f"Kubernetes RBAC must grant you the verb ray:write on rayclusters/{head.name} in "
            f"namespace {head.namespace} (check: kubectl auth can-i ray:write "
            f"rayclusters/{head.name} -n {head.namespace})"
            if head.auth == "kubernetes"
            else "its token comes from the stack's Secret (ray-tpu:security, docs/security.md)"
        )
        raise SubmitError(
            f"the Ray head of {head.kind} {head.name!r} refused the credential "
            f"(HTTP {response.status_code}): {how}"
        )
    if response.status_code == errors.UPSTREAM_RATE_LIMITED.http_status:
        raise HeadRateLimitedError(f"{url} answered HTTP 429 (rate limited): retry later")
    if response.status_code != 200:
        raise HeadUnreachableError(
            f"{url} answered HTTP {response.status_code}: not a Ray dashboard.\n{hint}"
        )
    try:
        return str(response.json()["ray_version"])
    except (ValueError, KeyError) as error:
        raise HeadUnreachableError(
            f"{url} answered without a ray_version: not a Ray dashboard.\n{hint}"
        ) from error


def _client(
    address: str, request_timeout_s: float, headers: Mapping[str, str] | None = None
) -> Any:
    """A ``JobSubmissionClient`` whose every HTTP request has a timeout (the SDK sets none)."""
    from ray.job_submission import JobSubmissionClient

    class _TimedJobSubmissionClient(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", request_timeout_s)
            return super()._do_request(method, endpoint, **kwargs)

    return _TimedJobSubmissionClient(address, headers=dict(headers or {}) or None)


# --- the job ----------------------------------------------------------------------------------


def stage_working_dir(destination: Path, repo_root: Path = REPO_ROOT) -> Path:
    """Copy the packages a job imports into ``destination`` (the job's ``working_dir``)."""
    for package in WORKING_DIR_PACKAGES:
        source = repo_root / package
        if not (source / "__init__.py").is_file():
            raise SubmitError(
                f"working_dir: package {package!r} not found at {source}; run raytpu submit "
                "from a checkout of the repository"
            )
        shutil.copytree(
            source, destination / package, ignore=shutil.ignore_patterns(*WORKING_DIR_IGNORE)
        )
    return destination


def runtime_env(working_dir: Path, *, pip: bool, env_vars: Mapping[str, str]) -> dict[str, Any]:
    """The job's runtime environment (Ray's ``runtime_env`` dict)."""
    env: dict[str, Any] = {"working_dir": str(working_dir), "env_vars": dict(env_vars)}
    if pip:
        env["pip"] = {"packages": entrypoints.worker_requirements(), "pip_check": False}
    return env


def train_entrypoint(outputs: StackOutputs, head: RayHead, extra: Sequence[str]) -> str:
    """``python -m raytpu_cli train`` sized to the cluster's slice (the catalog record)."""
    slice_out = outputs.slice(head.slice)
    num_slices = head.replicas if head.replicas is not None else slice_out.count
    return shlex.join(entrypoints.train_command(slice_out.shape, num_slices, extra))


def build_request(
    job: Sequence[str],
    outputs: StackOutputs,
    head: RayHead,
    working_dir: Path,
    *,
    pip: bool = False,
    env: Mapping[str, str] | None = None,
    raw: bool = False,
    run: str | None = None,
) -> JobRequest:
    """Turn ``train ...`` / ``serve ...`` / ``COMMAND ...`` into a job request.

    ``raw`` (the command came after ``--``): run ``job`` as is, even if it starts with ``train``
    or ``serve``. ``env`` (``--env``) is added to the job's environment variables and wins.
    ``train`` on a stack with a checkpoint bucket writes to ``gs://BUCKET/<run>`` (``run``:
    default the RayCluster's name) unless ``--checkpoint-dir`` or ``RAYTPU_CHECKPOINT_DIR`` says
    otherwise; a RayService serves ``gs://BUCKET/<checkpointRun>``.
    """
    if not job:
        raise SubmitError(
            "job: is required; valid: train [ARGS], serve [ARGS], or -- COMMAND [ARGS]"
        )
    workload, *extra = ("command", *job) if raw else job
    if workload == "train":
        entrypoint = train_entrypoint(outputs, head, extra)
    elif workload == "serve":
        entrypoint = shlex.join(entrypoints.serve_command(extra))
    else:
        workload, entrypoint = "command", shlex.join(job)
    slice_out = outputs.slice(head.slice)
    env_vars = entrypoints.slice_env(outputs.stack, head.name, head.slice, slice_out.shape)
    if workload == "serve":
        # One Serve replica per TPU host of the cluster's slice (workloads.serving.app reads this).
        env_vars.update(entrypoints.serve_env(slice_out.shape))
    checkpoints = outputs.checkpoint_dir(run or head.name)
    if workload == "train" and checkpoints and "--checkpoint-dir" not in extra:
        env_vars[entrypoints.CHECKPOINT_ENV] = checkpoints
    env_vars.update(env or {})
    return JobRequest(
        workload=workload,
        entrypoint=entrypoint,
        runtime_env=runtime_env(working_dir, pip=pip, env_vars=env_vars),
        submission_id=f"raytpu-{outputs.stack}-{workload}-{secrets.token_hex(4)}",
        metadata={"stack": outputs.stack, "cluster": head.name, "slice": head.slice},
    )


def submit(
    address: str,
    head: RayHead,
    request: JobRequest,
    *,
    wait: bool,
    timeout_s: float = DEFAULT_JOB_TIMEOUT_S,
    poll_s: float = POLL_INTERVAL_S,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    on_logs: Callable[[str], None] | None = None,
    headers: Mapping[str, str] | None = None,
) -> SubmitResult:
    """Submit ``request``; with ``wait``, follow its logs until it ends or ``timeout_s`` passes.

    The caller has checked the head with :func:`check_head`. ``headers`` carry the credential
    (:func:`raytpu_cli.ray_credentials.auth_headers`).
    """
    client = _client(address, request_timeout_s, headers)
    started = time.monotonic()
    job_id = client.submit_job(
        entrypoint=request.entrypoint,
        submission_id=request.submission_id,
        runtime_env=dict(request.runtime_env),
        metadata=dict(request.metadata),
    )
    if not wait:
        status = str(client.get_job_status(job_id))
        return SubmitResult(job_id=job_id, address=address, head=head, status=status, waited=False)
    printed = 0
    logs = ""
    deadline = started + timeout_s
    while True:
        info = client.get_job_info(job_id)
        logs = client.get_job_logs(job_id)
        if on_logs is not None and len(logs) > printed:
            on_logs(logs[printed:])
            printed = len(logs)
        if info.status.is_terminal():
            return SubmitResult(
                job_id=job_id,
                address=address,
                head=head,
                status=str(info.status),
                waited=True,
                message=info.message or "",
                logs=logs,
                duration_s=time.monotonic() - started,
            )
        if time.monotonic() >= deadline:
            raise JobTimeoutError(
                f"job {job_id} is still {info.status} after {timeout_s:.0f} s; it keeps running. "
                f"Follow it with `ray job logs --follow --address {address} {job_id}` or stop it "
                f"with `ray job stop --address {address} {job_id}`"
            )
        time.sleep(poll_s)


# --- command line -----------------------------------------------------------------------------
