"""Train the byte-level LM on a TPU slice from a stack's config, through Ray Train's JaxTrainer.

Examples:
  raytpu train --stack dev --slice train --local --steps 60 --checkpoint-dir gs://raytpu-local/ck
  raytpu train --stack dev --slice train --address ray://ray-head:10001 --checkpoint-dir gs://b/ck
  python -m raytpu_cli train --generation v6e --topology 2x4 --machine-type ct6e-standard-4t
  raytpu train --stack prod --slice train --num-slices 2 --preset 1b --tensor 1 \
      --address ray://ray-head:10001 --checkpoint-dir gs://b/llama-1b

Without --local or --address it joins the Ray cluster it runs in (inside a RayJob).

A slice of more than one host needs a ``gs://`` checkpoint directory (each host writes its own
shards and sees only its own disk); with --local a GCS emulator serves it, keeping the objects in
/tmp/raytpu/gcs for a later ``raytpu serve --local --checkpoint-dir`` of the same path.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from raytpu.errors import invalid
from raytpu.table import format_table
from raytpu_cli import failure
from raytpu_cli.common import (
    DEFAULT_CHECKPOINT_DIR,
    LOCAL_BUCKET,
    SliceChoice,
    UsageError,
    add_slice_arguments,
    check_seconds,
    check_writable_dir,
    local_storage,
    ray_cluster,
    resolve_slice,
)
from raytpu_cli.console import RunConsole, add_console_arguments, open_run_console
from workloads.storage import require_shared


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_slice_arguments(parser, default_slice="train")
    parser.add_argument(
        "--steps", type=int, default=100, help="train until this step (default 100)"
    )
    parser.add_argument(
        "--global-batch", type=int, default=32, help="sequences per step (default 32)"
    )
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps (default 50)")
    parser.add_argument(
        "--checkpoint-dir",
        default=DEFAULT_CHECKPOINT_DIR,
        help="Orbax checkpoints; resumes from the latest one (gs:// on GKE; default "
        "$RAYTPU_CHECKPOINT_DIR or /tmp/raytpu/checkpoints)",
    )
    parser.add_argument("--reserve-timeout", type=float, default=60.0, help="seconds (default 60)")
    parser.add_argument(
        "--start-timeout", type=float, default=120.0, help="worker group start bound, seconds"
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=2,
        help="attempts after a lost host, hang or preemption (default 2)",
    )
    parser.add_argument(
        "--spike-policy",
        default="skip",
        help="on a loss spike: log, skip (the batch) or rollback (default skip)",
    )
    parser.add_argument(
        "--slow-policy",
        default="warn",
        help="on a slow host: warn, or restart (on a spare slice if one is free, the slow "
        "host's slice held until the run ends; else warn) (default warn)",
    )
    parser.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="KIND@STEP[:HOST]",
        help="inject a fault (repeatable): kill-host, kill-slice, hang, spike, slow-host, "
        "preempt; e.g. --inject kill-host@40 --inject hang@70:1",
    )
    parser.add_argument(
        "--preset",
        help="train a Llama-style preset (raytpu.presets: tiny, 1b, 8b) on a hybrid mesh "
        "instead of the byte model: slices over DCN, FSDP (and --tensor) inside a slice",
    )
    parser.add_argument(
        "--tensor",
        type=int,
        default=1,
        help="with --preset or --init-from: tensor-parallel chips inside a slice; FSDP takes "
        "the rest (default 1)",
    )
    parser.add_argument(
        "--init-from",
        metavar="FOLDER",
        help="start from a Hugging Face Llama folder (config.json, safetensors, tokenizer.json; "
        "local or gs://): its config is the preset, its weights the first step's; not with "
        "--preset (docs/workloads/hugging-face.md)",
    )
    parser.add_argument(
        "--export-to",
        metavar="FOLDER",
        help="with --preset or --init-from: after the run, its last checkpoint as a Hugging "
        "Face folder (safetensors, config.json, tokenizer.json; local or gs://), what vLLM "
        "and transformers load",
    )
    add_console_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from workloads.training.driver import TrainingError

    try:
        with contextlib.ExitStack() as stack:
            storage = stack.enter_context(local_storage(args, (args.checkpoint_dir,)))
            resumed = _check_resumable(args, plan.model)
            console = stack.enter_context(_console(args))
            if storage or resumed:
                console.phase("; ".join(line for line in (resumed, storage) if line))
            stack.enter_context(ray_cluster(args, [plan.chosen], console))
            result = train_under(
                console,
                plan.chosen.shape,
                plan.config,
                num_slices=args.num_slices,
                reserve_timeout_s=args.reserve_timeout,
                start_timeout_s=args.start_timeout,
                scale=plan.scale,
            )
            if args.export_to:
                console.phase(f"exporting step {result.latest_checkpoint} to {args.export_to}")
                _export(result.checkpoint_dir, args.export_to)
            console.table(_summary(args, plan, result))
    except (UsageError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingError as error:
        return failure.report(error)
    except KeyboardInterrupt:
        print("interrupted: everything this command started was stopped", file=sys.stderr)
        return 130
    return 0


@dataclass(frozen=True)
class _Plan:
    """What one ``raytpu train`` run does, checked."""

    chosen: SliceChoice
    config: Any
    scale: Any
    model: str | None
    """The preset trained (``--preset``, or the one ``--init-from``'s config.json gives);
    ``None``: the byte LM."""


def _plan(args: argparse.Namespace) -> _Plan:
    from workloads.training.config import TrainConfig
    from workloads.training.faults import check_hosts, parse_faults
    from workloads.training.goodput import GoodputConfig

    chosen = resolve_slice(args)
    faults = parse_faults(args.inject, field="--inject")
    config = TrainConfig(
        checkpoint_dir=args.checkpoint_dir,
        steps=args.steps,
        global_batch=args.global_batch,
        checkpoint_every=args.checkpoint_every,
        goodput=GoodputConfig(
            max_restarts=args.max_restarts,
            spike_policy=args.spike_policy,
            slow_policy=args.slow_policy,
            faults=tuple(str(f) for f in faults),
        ),
    )
    config.validate(chosen.shape, args.num_slices)
    imported = _imported_preset(args)
    scale = _scale(args, chosen.shape, config, imported)
    check_seconds("--reserve-timeout", args.reserve_timeout)
    check_seconds("--start-timeout", args.start_timeout)
    check_writable_dir("--checkpoint-dir", args.checkpoint_dir)
    processes = chosen.shape.workers() * args.num_slices
    check_hosts(faults, processes, args.steps, field="--inject")
    try:
        require_shared("--checkpoint-dir", args.checkpoint_dir, processes)
    except ValueError as error:
        hint = f" (with --local: gs://{LOCAL_BUCKET}/NAME)" if args.local else ""
        raise UsageError(f"{error}{hint}") from None
    return _Plan(chosen, config, scale, imported.name if imported else args.preset)


def _check_resumable(args: argparse.Namespace, model: str | None) -> str:
    """The run resumes from the directory's latest step: it must hold this model (a line saying
    where it resumes from; ``""`` for a fresh run, or on a cluster's ``gs://``, read there)."""
    directory = args.checkpoint_dir
    if directory.startswith("gs://") and not args.local:
        return ""
    from raytpu_cli.checkpoint_check import check_resumable, filesystem

    found = check_resumable("--checkpoint-dir", directory, model, filesystem(directory))
    if found.latest is None:
        return ""
    return f"checkpoint {directory}: resuming {found.model} from step {found.latest}"


def _console(args: argparse.Namespace) -> RunConsole:
    """The console of this run. Inside a Ray job (no --local, no --address) everything stays
    on stdout, where ``ray job logs`` and the RayJob's pod logs show it."""
    if not args.local and not args.address:
        return RunConsole(Path(args.log_file or "/dev/null"), verbose=True)
    return open_run_console(args, "train")


def train_under(console: RunConsole, shape: Any, config: Any, **options: Any) -> Any:
    """:func:`workloads.training.driver.run_training` under a progress bar of its steps."""
    from workloads.training.driver import run_training

    seen: list[Any] = []
    with console.progress() as bar:
        task = bar.add_task("training", total=config.steps, detail="")

        def show(progress: Any) -> None:
            seen.append(progress)
            bar.update(task, completed=progress.step, detail=progress_text(progress))

        result = run_training(shape, config, on_progress=show, **options)
        last = f"loss {result.last_loss:.3f}"
        if seen:  # the speed as the workers last reported it
            last = progress_text(replace(seen[-1], loss=result.last_loss))
        bar.update(task, completed=result.final_step, detail=last)
    return result


def progress_text(progress: Any) -> str:
    return f"loss {progress.loss:.3f}  {progress.tokens_per_s:,.0f} tokens/s"


def _summary(args: argparse.Namespace, plan: _Plan, result: Any) -> str:
    rows = [
        ("trained", f"{plan.chosen.shape.name} x {args.num_slices}"),
        ("steps", f"{result.resumed_from} -> {result.final_step} in {result.seconds:.0f} s"),
        ("loss", f"{result.first_loss:.3f} -> {result.last_loss:.3f}"),
        ("jax", f"{result.process_count} processes / {result.device_count} devices"),
        ("checkpoint", f"{result.checkpoint_dir} @ {result.latest_checkpoint}"),
    ]
    if plan.scale is not None:
        rows.append(("preset", f"{plan.model} on mesh {result.scale.get('mesh')}"))
    rows.append(
        (
            "goodput",
            f"{result.goodput:.0%} over {result.wall_s:.0f} s, {result.attempts} attempt(s); "
            f"events in {result.log_dir}/events.jsonl",
        )
    )
    rows += [("event", event.line()) for event in result.events]
    return format_table(("train", "result"), rows)


def _imported_preset(args: argparse.Namespace) -> Any:
    """``--init-from``'s preset (its config.json, read once), or ``None``; refused with
    ``--preset``."""
    if not args.init_from:
        return None
    if args.preset:
        raise UsageError(
            invalid(
                "--preset", args.preset, "unset with --init-from (its config.json is the preset)"
            )
        )
    from workloads.model import hf_llama

    return hf_llama.read_preset(args.init_from)


def _scale(args: argparse.Namespace, shape: Any, config: Any, imported: Any) -> Any:
    """``--preset``/``--tensor`` as a checked :class:`raytpu.presets.ScaleConfig` (``None``
    without ``--preset``); a preset that cannot fit or divide over the mesh is refused here,
    before anything starts."""
    from raytpu.presets import MeshConfig, PresetError, ScaleConfig

    if args.preset is None and imported is None:
        given = (
            ("--tensor", args.tensor, args.tensor != 1),
            ("--export-to", args.export_to, args.export_to),
        )
        for flag, value, set_ in given:
            if set_:
                raise UsageError(invalid(flag, value, "unset without --preset or --init-from"))
        return None
    try:
        mesh = MeshConfig.fsdp_over(shape.chips, args.num_slices, tensor=args.tensor)
    except PresetError as error:  # the one fsdp_over raises: tensor does not divide the slice
        raise UsageError(invalid("--tensor", args.tensor, error.valid)) from None
    if imported is not None:
        scale = ScaleConfig(mesh=mesh, init_from=args.init_from)
        scale.check(shape, args.num_slices, config.global_batch, imported)
        return scale
    scale = ScaleConfig(preset=args.preset, mesh=mesh)
    scale.check(shape, args.num_slices, config.global_batch)
    return scale


def _export(checkpoint_dir: str, folder: str) -> None:
    """The run's last checkpoint as a Hugging Face folder, from this process (the Ray job's
    driver: the head): one tensor at a time."""
    from workloads.model import hf_llama

    hf_llama.export_checkpoint(checkpoint_dir, folder)
