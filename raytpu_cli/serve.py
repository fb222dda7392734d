"""Serve the latest checkpoint over HTTP with Ray Serve on the stack's serving slice.

Examples:
  raytpu serve --stack dev --slice serve --local --prompt "The old teacher"
  raytpu serve --stack dev --slice serve --local --duration 300     # then curl the printed URL
  raytpu serve --stack dev --slice serve --address ray://ray-head:10001 --checkpoint-dir gs://b/ck

--local serves for --duration seconds (or answers --prompt and exits), then shuts everything down.
With --address the application stays deployed on that cluster after the command exits.
"""

from __future__ import annotations

import argparse
import sys
import time

from raytpu_cli.common import (
    DEFAULT_CHECKPOINT_DIR,
    UsageError,
    add_slice_arguments,
    check_checkpoint_dir,
    check_seconds,
    post_json,
    ray_cluster,
    resolve_slice,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_slice_arguments(parser, default_slice="serve")
    parser.add_argument(
        "--checkpoint-dir", default=DEFAULT_CHECKPOINT_DIR, help="Orbax checkpoints"
    )
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: a free one)")
    parser.add_argument(
        "--prompt", action="append", default=[], help="send this prompt; repeatable"
    )
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.5)
    parser.add_argument(
        "--duration", type=float, default=600.0, help="--local without --prompt: serve this long"
    )
    parser.add_argument("--deploy-timeout", type=float, default=180.0, help="seconds")


def run(args: argparse.Namespace) -> int:
    from workloads.serving import app as serving
    from workloads.sim.local_cluster import free_port

    try:
        chosen = resolve_slice(args)
        check_seconds("--deploy-timeout", args.deploy_timeout)
        if args.local:  # the replicas run here: the folder must hold a checkpoint now
            check_checkpoint_dir("--checkpoint-dir", args.checkpoint_dir)
        application = serving.build_app(args.checkpoint_dir, chosen.shape)
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    port = args.port or free_port()
    try:
        with ray_cluster(args, [chosen], storage=(args.checkpoint_dir,)):
            handle = serving.deploy(application, port=port, timeout_s=args.deploy_timeout)
            print(f"serving {args.checkpoint_dir} at {handle.url} ({handle.deploy_s:.1f} s)")
            try:
                for prompt in args.prompt:
                    reply = post_json(
                        handle.url,
                        {
                            "prompt": prompt,
                            "max_new_tokens": args.max_new_tokens,
                            "temperature": args.temperature,
                        },
                    )
                    print(f"{reply.status} {reply.seconds * 1000:.0f} ms {reply.body}")
                if args.local and not args.prompt:
                    print(f"serving for {args.duration:.0f} s; Ctrl-C stops")
                    time.sleep(args.duration)
            finally:
                if args.local:
                    serving.shutdown()
    except (TimeoutError, RuntimeError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: everything this command started was stopped", file=sys.stderr)
        return 130
    return 0
