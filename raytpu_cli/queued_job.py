"""``raytpu submit --queue Q [--priority P]``: a RayJob for a team's Kueue queue.

A job sent through Ray's Job Submission API runs on a RayCluster that is already up: Kueue never
sees it. To wait for, and count against, a team's quota the job must be its own RayJob carrying
``kueue.x-k8s.io/queue-name`` (and ``kueue.x-k8s.io/priority-class``). With ``--queue``,
``raytpu submit`` writes that RayJob instead of submitting (the same manifest the stack's
``ray-tpu:rayJobs`` declare: :mod:`infra.manifests.rayjob`), for ``kubectl create -f -``; Kueue then
admits it when the team's ClusterQueue has whole slices for it (docs/governance.md).
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import sys
from typing import Any

import yaml

from raytpu.errors import invalid


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queue",
        help="a team's Kueue queue (its ray-tpu:teams name): write a queued RayJob for "
        "`kubectl create -f -` instead of submitting to a running cluster",
    )
    parser.add_argument(
        "--priority", help="with --queue: a ray-tpu:priorityClasses name (default: the team's)"
    )
    parser.add_argument("--name", help="with --queue: the RayJob's name (default: generated)")


def run(args: argparse.Namespace, job: list[str], raw: bool) -> int:
    from infra.config.ray_objects import parse_ray_job
    from infra.config.reader import Problems
    from infra.config.schema import ConfigError
    from infra.config.teams import check_team_objects
    from infra.manifests.rayjob import ray_job_object
    from raytpu_cli.common import UsageError, load_stack_config

    try:
        stack = load_stack_config(args)
    except (ConfigError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    teams = {t.name: t for t in stack.teams}
    if args.queue not in teams:
        valid = ", ".join(teams) or f"(stack {args.stack} declares no ray-tpu:teams)"
        print(f"error: {invalid('--queue', args.queue, valid)}", file=sys.stderr)
        return 2
    if not raw and job[0] != "train":
        print(
            "error: "
            + invalid(
                "job",
                job[0],
                "train [ARGS] or -- COMMAND (a served app is a RayService in the stack)",
                reason="--queue is given",
            ),
            file=sys.stderr,
        )
        return 2
    team = teams[args.queue]
    item: dict[str, Any] = {
        "name": args.name or f"{team.name}-{secrets.token_hex(3)}",
        "slice": args.slice_name or team.quotas[0].slice,
        "replicas": 1,
        "namespace": team.namespace,
        "team": team.name,
        **({"priority": args.priority} if args.priority else {}),
        **({"entrypoint": shlex.join(job)} if raw else {"args": job[1:]}),
    }
    problems = Problems()
    slices = {s.name: s for s in stack.slices}
    config = parse_ray_job(problems, 0, item, slices, stack.ray_version)
    if config is not None:
        check_team_objects(problems, stack.teams, stack.priority_classes, slices, [("job", config)])
    if problems.errors or config is None:
        for error in problems.errors:
            print(f"error: {_as_flag(error)}", file=sys.stderr)
        return 2
    manifest = ray_job_object(stack, config, stack_name=args.stack)
    print(yaml.safe_dump(manifest, sort_keys=False), end="")
    print(
        f"RayJob {manifest['metadata']['name']} for queue {team.name} (namespace {team.namespace}, priority "
        f"{config.priority or team.priority}); create it with: raytpu submit ... | kubectl "
        "create -f -",
        file=sys.stderr,
    )
    return 0


def _as_flag(error: str) -> str:
    """Config key paths of the generated RayJob as the flags that set them."""
    for key, flag in (
        ("rayJobs[0].slice", "--slice"),
        ("job.slice", "--slice"),
        ("rayJobs[0].priority", "--priority"),
        ("job.priority", "--priority"),
        ("rayJobs[0].name", "--name"),
    ):
        error = error.replace(f"ray-tpu:{key}", flag).replace(key, flag)
    return error
