"""Run a dataset of prompts through the model on reserved TPU slices (Ray Data), into files.

Examples:
  raytpu batch --stack dev --slice train --local --checkpoint-dir gs://raytpu-local/ck \
      --input prompts.jsonl --output gs://raytpu-local/batch/run1
  raytpu batch --stack prod --slice batch --input gs://b/prompts/ --output gs://b/out/run1 \
      --checkpoint-dir gs://b/ck --address ray://ray-head:10001

Without --local or --address it joins the Ray cluster it runs in (inside a RayJob: the stack's
``rayJobs[]`` with ``entrypoint: python -m raytpu_cli batch ...``, docs/workloads/batch.md).

--input is JSON Lines (a file, or a folder of *.jsonl), one prompt per line: a JSON string or
{"prompt", "max_new_tokens", "temperature", "id"}. --output gets part-NNNNNN.jsonl, one per
chunk of --chunk-rows prompts, each written once: run the same command again after a failure and
only the chunks with no file yet are computed. Every line of the input is checked before
anything starts (exit 2 naming the file, line and field).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

from raytpu.errors import invalid
from raytpu.table import format_table
from raytpu_cli.common import (
    DEFAULT_CHECKPOINT_DIR,
    LOCAL_BUCKET,
    SliceChoice,
    UsageError,
    add_slice_arguments,
    check_seconds,
    local_storage,
    ray_cluster,
    resolve_slice,
)
from raytpu_cli.console import RunConsole, add_console_arguments, open_run_console

KILL_ACTOR = "kill-actor"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_slice_arguments(parser, default_slice="train")
    parser.add_argument("--input", required=True, help="JSON Lines prompts (local or gs://)")
    parser.add_argument("--output", required=True, help="folder for the part files (gs://)")
    parser.add_argument(
        "--checkpoint-dir", default=DEFAULT_CHECKPOINT_DIR, help="the model (Orbax or HF)"
    )
    parser.add_argument("--chunk-rows", type=int, default=128, help="prompts per output file")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per engine batch")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="a row's default")
    parser.add_argument("--temperature", type=float, default=0.0, help="a row's default")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the job")
    parser.add_argument(
        "--no-prefix-cache", action="store_true", help="turn the engine's prefix cache off"
    )
    parser.add_argument("--reserve-timeout", type=float, default=60.0, help="seconds")
    parser.add_argument("--timeout", type=float, default=3600.0, help="the run's bound, seconds")
    parser.add_argument(
        "--inject",
        metavar=f"{KILL_ACTOR}@CHUNK",
        help="kill the actor writing this chunk, once (a recovery drill)",
    )
    add_console_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        chosen, config = _plan(args)
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from workloads.batch.job import plan_batch, run_batch
    from workloads.slices.reservation import HostLostError, SliceReservationError

    console: RunConsole | None = None
    try:
        with contextlib.ExitStack() as stack:
            paths = (args.input, args.output, args.checkpoint_dir)
            storage = stack.enter_context(local_storage(args, paths))
            plan = plan_batch(config)
            console = stack.enter_context(_console(args))
            console.phase(_plan_line(plan, storage))
            if plan.pending:  # all done already: no cluster, only the output check
                stack.enter_context(ray_cluster(args, [chosen], console))
            result = _run_under(console, chosen, plan, args.num_slices, run_batch)
            console.table(_summary(chosen, plan, result))
            if not result.check.exactly_once:
                console.error(f"error: outputs not exactly once: {result.check}")
                return 1
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (SliceReservationError, HostLostError, TimeoutError, RuntimeError) as error:
        logs = f"; logs: {console.log_path}" if console is not None else ""
        print(f"error: {error}{logs}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: everything this command started was stopped", file=sys.stderr)
        return 130
    return 0


def _plan(args: argparse.Namespace) -> tuple[SliceChoice, Any]:
    """The slice and the checked :class:`workloads.batch.job.BatchConfig` (flags only; the
    input's lines are checked by ``plan_batch``, once its storage is up)."""
    from workloads.batch.job import BatchConfig
    from workloads.storage import require_shared

    chosen = resolve_slice(args)
    check_seconds("--reserve-timeout", args.reserve_timeout)
    check_seconds("--timeout", args.timeout)
    processes = chosen.shape.workers() * args.num_slices
    for flag, value in (("--output", args.output), ("--checkpoint-dir", args.checkpoint_dir)):
        try:
            require_shared(flag, value, processes)
        except ValueError as error:
            hint = f" (with --local: gs://{LOCAL_BUCKET}/NAME)" if args.local else ""
            raise UsageError(f"{error}{hint}") from None
    config = BatchConfig(
        input=args.input,
        output=args.output,
        checkpoint_dir=args.checkpoint_dir,
        chunk_rows=args.chunk_rows,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        prefix_cache=not args.no_prefix_cache,
        reserve_timeout_s=args.reserve_timeout,
        timeout_s=args.timeout,
        kill_chunk=_kill_chunk(args.inject),
    )
    flags = {"chunk_rows": "--chunk-rows", "batch_size": "--batch-size"}
    flags.update(max_new_tokens="--max-new-tokens", temperature="--temperature", seed="--seed")
    try:
        config.validate()
    except ValueError as error:  # the library names its field; the user typed a flag
        field = str(error).split(":", 1)[0]
        raise UsageError(str(error).replace(field, flags.get(field, field), 1)) from None
    return chosen, config


def _kill_chunk(text: str | None) -> int | None:
    if text is None:
        return None
    kind, _, chunk = text.partition("@")
    if kind != KILL_ACTOR or not chunk.isdigit():
        raise UsageError(invalid("--inject", text, f"{KILL_ACTOR}@CHUNK (a chunk number >= 0)"))
    return int(chunk)


def _console(args: argparse.Namespace) -> RunConsole:
    """Inside a Ray job (no --local, no --address) everything stays on stdout."""
    if not args.local and not args.address:
        return RunConsole(Path(args.log_file or "/dev/null"), verbose=True)
    return open_run_console(args, "batch")


def _plan_line(plan: Any, storage: str) -> str:
    done = len(plan.chunks) - len(plan.pending)
    line = (
        f"{len(plan.prompts)} prompts in {len(plan.chunks)} chunks of {plan.config.chunk_rows}; "
        f"{len(plan.pending)} to do"
    )
    if plan.resumed:
        line += f" ({done} already in {plan.config.output}: resumed)"
    return f"{line}; {storage}" if storage else line


def _run_under(
    console: RunConsole, chosen: SliceChoice, plan: Any, num_slices: int, run_batch: Any
) -> Any:
    """``run_batch`` under a progress bar of the rows written."""
    with console.progress() as bar:
        task = bar.add_task("prompts", total=plan.pending_rows, detail="reserving")
        written = {"rows": 0, "tokens": 0}

        def reserved(reservation: Any) -> None:
            hosts = len(reservation.hosts)
            detail = f"{hosts} hosts of {', '.join(reservation.slice_names)}: loading the model"
            bar.update(task, detail=detail)

        def chunk(done: Any) -> None:
            written["rows"] += done.rows
            written["tokens"] += done.tokens
            detail = f"chunk {done.chunk} by {done.host}; {written['tokens']:,} tokens"
            bar.update(task, completed=written["rows"], detail=detail)

        return run_batch(
            chosen.shape, plan, num_slices=num_slices, on_chunk=chunk, on_reserved=reserved
        )


def _summary(chosen: SliceChoice, plan: Any, result: Any) -> str:
    check = result.check
    hosts: dict[str, int] = {}
    for done in result.chunks_written:
        hosts[done.host] = hosts.get(done.host, 0) + done.rows
    rows = [
        ("slices", f"{chosen.shape.name}: {', '.join(result.slice_names) or '(none needed)'}"),
        ("prompts", f"{result.rows_written} written, {result.skipped_chunks} chunks already done"),
        (
            "speed",
            f"{result.rows_per_s:.1f} prompts/s, {result.tokens:,} tokens in {result.run_s:.1f} s",
        ),
        ("hosts", ", ".join(f"{h}: {n}" for h, n in sorted(hosts.items())) or "-"),
        ("output", f"{plan.config.output}: {check.files} files, {check.rows} rows"),
        ("exactly once", "yes" if check.exactly_once else f"NO: {check}"),
    ]
    return format_table(("batch", "result"), rows)
