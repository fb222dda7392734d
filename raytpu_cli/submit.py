"""``raytpu submit``: submit a workload to the Ray cluster that ``pulumi up`` made.

Examples:
  kubectl port-forward svc/train-head-svc 8265:8265 -n ray     # in another terminal
  raytpu submit --stack dev train --steps 100
  raytpu submit --stack dev --outputs dev-outputs.json --no-wait train
  raytpu submit --stack dev --cluster train -- python -m raytpu_cli catalog v6e 2x4 --json
  raytpu submit --stack dev --cluster train serve
  raytpu submit --stack dev --run exp2 train        # checkpoints in gs://BUCKET/exp2
  raytpu submit --stack prod --queue research --priority high train --steps 1000 | kubectl create -f -

`train` keeps its checkpoints in the stack's bucket, gs://BUCKET/<run> (run: --run, default the
RayCluster's name); a RayService serves gs://BUCKET/<its checkpointRun> (default `train`).

How the head is chosen and what is sent: :mod:`raytpu_cli.jobs`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from raytpu import entrypoints, stack_outputs
from raytpu.errors import invalid
from raytpu.stack_outputs import StackOutputsError
from raytpu_cli import failure, queued_job
from raytpu_cli.console import LogSplitter, add_console_arguments, run_log_path
from raytpu_cli.jobs import (
    DEFAULT_ADDRESS,
    DEFAULT_JOB_TIMEOUT_S,
    SubmitError,
    _service_message,
    build_request,
    check_head,
    choose_head,
    serving_service,
    stage_working_dir,
    submit,
)
from raytpu_cli.ray_credentials import CredentialError, auth_headers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--stack", required=True, help="Pulumi stack name, e.g. dev or prod")
    parser.add_argument(
        "--outputs",
        type=Path,
        help="saved `pulumi stack output --json --stack STACK` (default: run pulumi)",
    )
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"Ray dashboard address of the head, reached by port-forward (default {DEFAULT_ADDRESS})",
    )
    parser.add_argument("--cluster", help="RayCluster name in the stack (default: chosen for you)")
    parser.add_argument("--slice", dest="slice_name", help="submit to the RayCluster on this slice")
    parser.add_argument(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="follow the job's logs until it ends (default) or print its id and return",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_JOB_TIMEOUT_S,
        help=f"seconds to wait for the job with --wait (default {DEFAULT_JOB_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--pip",
        action="store_true",
        help="install the pinned packages and jax[tpu] in the runtime env (stock Ray image); "
        "default: use the packages of the worker image",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for the job, e.g. RAYTPU_CHECKPOINT_DIR=gs://BUCKET/ckpt "
        "(repeatable)",
    )
    add_console_arguments(parser)  # --verbose, --log-file: the followed job's whole log
    queued_job.add_arguments(parser)  # --queue, --priority, --name: a RayJob for Kueue
    parser.add_argument(
        "--run",
        help="training run name: checkpoints go to gs://<checkpointBucket>/RUN (default: the "
        "RayCluster's name); ignored with --checkpoint-dir or --env RAYTPU_CHECKPOINT_DIR=...",
    )
    parser.add_argument(
        "job",
        nargs=argparse.REMAINDER,
        metavar="train|serve|COMMAND ...",
        help="`train [ARGS]`, `serve [ARGS]`, or `-- COMMAND [ARGS]` for any entrypoint",
    )


def _print_line(line: str) -> None:
    print(line, flush=True)


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """``["K=V", ...]`` from ``--env``; ``ValueError`` naming the bad pair."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not key.replace("_", "a").isalnum():
            raise ValueError(invalid("--env", pair, "KEY=VALUE, e.g. JAX_LOG=1"))
        env[key] = value
    return env


def run(args: argparse.Namespace) -> int:
    job = list(args.job)
    raw = bool(job) and job[0] == "--"
    if raw:
        job = job[1:]
    if not job:
        print(
            "error: job: is required; valid: train [ARGS], serve [ARGS], or -- COMMAND [ARGS]",
            file=sys.stderr,
        )
        return 2
    if args.queue or args.priority:
        if not args.queue:
            print("error: --priority: needs --queue (a team's queue)", file=sys.stderr)
            return 2
        return queued_job.run(args, job, raw)
    try:
        env = parse_env(args.env)
        log_path = run_log_path(args, "submit") if args.wait else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    show = LogSplitter(log_path, _print_line, verbose=args.verbose) if log_path else None
    workload = "command" if raw else job[0]
    try:
        outputs = stack_outputs.load_outputs(args.stack, args.outputs, args.cwd)
        service = serving_service(outputs, workload, args.cluster, args.slice_name)
        if service is not None:
            print(_service_message(service, cluster_hint=outputs))
            return 0
        head = choose_head(
            outputs, workload=workload, cluster=args.cluster, slice_name=args.slice_name
        )
        headers = auth_headers(head)
        ray_version = check_head(args.address, head, headers=headers)
        with tempfile.TemporaryDirectory(prefix="raytpu-job-") as tmp:
            working_dir = stage_working_dir(Path(tmp))
            request = build_request(
                job, outputs, head, working_dir, pip=args.pip, env=env, raw=raw, run=args.run
            )
            print(
                f"submitting {request.workload} to {head.kind} {head.name!r} "
                f"(slice {head.slice!r}, Ray {ray_version}) at {args.address}:\n"
                f"  {request.entrypoint}",
                file=sys.stderr,
            )
            checkpoints = request.runtime_env["env_vars"].get(entrypoints.CHECKPOINT_ENV)
            if request.workload == "train" and checkpoints:
                print(f"  checkpoints: {checkpoints}", file=sys.stderr)
            if log_path is not None:
                shown = (
                    "" if args.verbose else " (Ray's own lines only there; --verbose shows them)"
                )
                print(f"  the job's whole log: {log_path}{shown}", file=sys.stderr)
            result = submit(
                args.address,
                head,
                request,
                wait=args.wait,
                timeout_s=args.timeout,
                on_logs=show,
                headers=headers,
            )
            if show is not None:
                show.flush()
    except StackOutputsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (SubmitError, CredentialError) as error:
        return failure.report(error)
    print(f"job {result.job_id}: {result.status}", file=sys.stderr)
    if not result.waited:
        print(
            f"follow it: ray job logs --follow --address {args.address} {result.job_id}",
            file=sys.stderr,
        )
        print(result.job_id)
        return 0
    if result.message and not result.succeeded:
        print(result.message, file=sys.stderr)
    return 0 if result.succeeded else 1
