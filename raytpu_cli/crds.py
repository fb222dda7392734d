"""Fetch the CRDs the schema checks read, at the pins of raytpu/crd_pins.py, or show where they are.

`raytpu preview` and `raytpu check` validate KubeRay, Kueue and managed-Prometheus objects against
these CRDs when they are on disk, and say which sets they skipped when not. Declaring resources
(`pulumi preview`, `pulumi up`) never needs them.

Each set is downloaded whole into a temporary folder, each file checked to be the CRD it should
be, then moved into place: a failed fetch leaves what was there before.

Exit codes: 0 fetched (or shown), 2 a download or a file failed.

Examples:
  raytpu crds                      # where each set is read from, and whether it is there
  raytpu crds fetch                # into .crds/<set>/ (git-ignored)
  raytpu crds fetch --into /tmp/crds --set kuberay
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from raytpu import crd_pins, crds, gmp_crds, kueue
from raytpu.crds import CrdSet
from raytpu.errors import invalid

SETS = (crds.KUBERAY, kueue.KUEUE, gmp_crds.GMP)
TIMEOUT_S = 30.0


class FetchError(RuntimeError):
    """A CRD file could not be downloaded, or is not the CRD it should be."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("action", nargs="?", choices=("show", "fetch"), default="show")
    parser.add_argument(
        "--set",
        dest="sets",
        action="append",
        metavar="NAME",
        help=f"only this set (repeatable; {', '.join(s.pin.name for s in SETS)})",
    )
    parser.add_argument(
        "--into",
        type=Path,
        help=f"folder to hold <set>/ folders (default: {crd_pins.LOCAL_HOME})",
    )
    parser.add_argument("--base-url", default=crd_pins.RAW_BASE, help="raw file host")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per file")


def chosen(names: list[str] | None) -> list[CrdSet]:
    """The sets ``--set`` names (all by default); ValueError listing the valid names."""
    by_name = {s.pin.name: s for s in SETS}
    for name in names or []:
        if name not in by_name:
            raise ValueError(invalid("--set", name, by_name))
    return [by_name[n] for n in names] if names else list(SETS)


def fetch_set(crd_set: CrdSet, into: Path, base_url: str, timeout_s: float) -> Path:
    """Download every file of ``crd_set`` and move the folder to ``into/<name>``."""
    target = into / crd_set.pin.name
    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=into, prefix=f".{crd_set.pin.name}-") as staging:
        for filename in crd_set.filenames():
            url = crd_set.pin.url(filename, base_url)
            body = _download(url, timeout_s)
            _check_crd(body, crd_set, url)
            (Path(staging) / filename).write_bytes(body)
        if target.exists():
            shutil.rmtree(target)
        shutil.move(staging, target)
    return target


def _download(url: str, timeout_s: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read()
    except (urllib.error.URLError, TimeoutError) as error:
        raise FetchError(f"{url}: {getattr(error, 'reason', error)}") from error


def _check_crd(body: bytes, crd_set: CrdSet, url: str) -> None:
    try:
        crd = crds.load_crd_yaml(body)
    except yaml.YAMLError as error:
        raise FetchError(f"{url}: not YAML ({error})") from error
    if not isinstance(crd, dict) or crd.get("kind") != "CustomResourceDefinition":
        raise FetchError(f"{url}: not a CustomResourceDefinition")
    spec = crd.get("spec") or {}
    served = [v.get("name") for v in spec.get("versions") or []]
    if spec.get("group") != crd_set.group or crd_set.version not in served:
        raise FetchError(
            f"{url}: defines {spec.get('group')} {served}, not {crd_set.api_version}; "
            f"check the pin in raytpu/crd_pins.py"
        )


def _show(sets: list[CrdSet]) -> int:
    from raytpu.table import format_table

    rows = []
    for s in sets:
        missing = s.missing()
        state = f"missing {len(missing)} of {len(s.filenames())} files" if missing else "ok"
        rows.append(
            [s.pin.name, s.api_version, f"{s.pin.repository}@{s.pin.ref}", s.crds_dir(), state]
        )
    print(format_table(("set", "API", "pinned at", "read from", "state"), rows))
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        sets = chosen(args.sets)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.action == "show":
        return _show(sets)
    into = args.into or crd_pins.LOCAL_HOME
    for crd_set in sets:
        try:
            target = fetch_set(crd_set, into, args.base_url, args.timeout)
        except FetchError as error:
            print(f"error: {crd_set.pin.name}: {error}", file=sys.stderr)
            return 2
        print(
            f"{crd_set.pin.name}: {len(crd_set.filenames())} CRDs at {crd_set.pin.ref} -> {target}"
        )
        if args.into:
            print(f"  export {crd_set.env_var}={target}")
    return 0
