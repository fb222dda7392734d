"""``raytpu``: the command line of ray-tpu.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)`` and
``run(args) -> int`` and keeps heavy imports (ray, jax, pulumi) inside ``run``.
Exit codes: 0 success, 1 a check found violations or a run failed, 2 bad input, 3 an internal
error (a bug: one line on stderr, the traceback in a log file), 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from raytpu_cli.console import log_dir

EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

# name -> (module, one-line help). Add a command by adding a line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "catalog": ("raytpu_cli.catalog", "print TPU slice shapes (the one catalog)"),
    "check": ("raytpu_cli.check", "check manifests / Pulumi stack files against the policy pack"),
    "crds": ("raytpu_cli.crds", "fetch the pinned CRDs the schema checks read, or show them"),
    "preview": ("raytpu_cli.preview", "run a stack offline under mocks and apply the policy pack"),
    "submit": ("raytpu_cli.submit", "submit train/serve/any job to a stack's Ray cluster"),
    "quota": ("raytpu_cli.quota", "TPU quotas per team and shape, against the node pools"),
    "demo": ("raytpu_cli.demo", "train and serve on a simulated TPU slice cluster"),
    "train": ("raytpu_cli.train", "train the LM on a stack's TPU slice (JaxTrainer)"),
    "serve": ("raytpu_cli.serve", "serve the latest checkpoint with Ray Serve"),
    "batch": ("raytpu_cli.batch", "run a dataset of prompts on reserved slices (Ray Data)"),
    "observability": ("raytpu_cli.observability", "write alert rules and dashboards as files"),
    "status": ("raytpu_cli.status", "slices, jobs and Serve apps of a stack's Ray cluster"),
    "dashboard": (
        "raytpu_cli.dashboard",
        "open a stack's Ray Dashboard through kubectl port-forward",
    ),
    "notebook": ("raytpu_cli.notebook", "JupyterLab attached to a Ray cluster (token auth)"),
    "doctor": (
        "raytpu_cli.doctor",
        "after pulumi up: does the cluster run what the stack declares",
    ),
}
READS_PROJECT = (
    "preview",
    "submit",
    "demo",
    "train",
    "serve",
    "batch",
    "quota",
    "dashboard",
    "status",
    "doctor",
    "notebook",
)
"""Commands that read the Pulumi project of the current directory (or of --cwd)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytpu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(command)
        if name in READS_PROJECT:
            command.add_argument(
                "--cwd",
                metavar="DIR",
                help="look for the Pulumi project (Pulumi.yaml) in DIR and the folders above it, "
                "as `pulumi --cwd DIR` does (default: the current directory)",
            )
        command.set_defaults(_run=module.run)
    return parser


def write_crash_log(error: BaseException, argv: list[str]) -> Path:
    """The traceback of ``error`` in a new log file; its path (a temp file if the dir is not writable)."""
    text = f"raytpu {' '.join(argv)}\n" + "".join(
        traceback.format_exception(type(error), error, error.__traceback__)
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for folder in (log_dir(), Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, name = tempfile.mkstemp(
                prefix=f"raytpu-crash-{stamp}-", suffix=".log", dir=folder
            )
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            return Path(name)
        except OSError:
            continue
    return Path("(no writable log folder)")


def main(argv: list[str] | None = None) -> int:
    """Run one command. Never lets a traceback reach the user: an unexpected exception becomes
    one line plus a log file (exit 3), Ctrl-C exits 130."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:  # the top-level guard: every command's bugs end here
        log = write_crash_log(error, argv)
        summary = (str(error).strip().splitlines() or [""])[0][:200]
        print(
            f"internal error: {type(error).__name__}: {summary}; please report; traceback in {log}",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
