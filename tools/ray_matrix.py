"""The Ray upgrade test: run the slice workloads' Ray tests under each Ray release, each in its own
virtual environment, and record which passed.

What runs per version is ``tests/test_workloads_ray.py`` on the simulated slice cluster: whole-slice
reservations (granted, refused within the timeout, released on error), a JaxTrainer run over every
host with a ``gs://`` checkpoint and a second run resuming from it, and Serve requests over HTTP on
the serving slice. The environment of each version is ``build/ray-matrix/venv-<version>``: its own
Ray (``ray[default,serve,train]==<version>`` and whatever that release requires), everything else
seen through a ``.pth`` line from the project's ``.venv``.

    python tools/ray_matrix.py                      # every version of VERSIONS
    python tools/ray_matrix.py --versions 2.55.1 2.60.0 --out docs/ray-matrix.json

Writes one JSON record per version (``version``, ``installed``, ``passed``, ``failed``, ``errors``,
``seconds``, ``failures``) and prints a table as it goes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VERSIONS = ("2.55.0", "2.55.1", "2.56.1", "2.57.1", "2.58.1", "2.59.0", "2.60.0")
"""From the first release with the slice API (2.55) to the pinned one, the newest patch of each
minor (and 2.55.0, the floor)."""
TESTS = ("tests/test_workloads_ray.py",)
INSTALL_TIMEOUT_S = 900
TEST_TIMEOUT_S = 1500


@dataclass
class Outcome:
    version: str
    installed: str = ""
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    note: str = ""

    @property
    def ok(self) -> bool:
        return (
            self.installed == self.version and self.passed > 0 and not (self.failed or self.errors)
        )


def _main_site_packages() -> Path:
    found = sorted((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    if not found:
        raise SystemExit("no .venv: run `make .venv/.installed` first")
    return found[0]


def _venv(version: str, root: Path) -> Path:
    """A venv of its own for ``version``, seeing the project's .venv behind its own packages."""
    venv = root / f"venv-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_raytpu_main_venv.pth").write_text(f"{_main_site_packages()}\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"ray[default,serve,train]=={version}"],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    return python


def _installed(python: Path) -> str:
    result = subprocess.run(
        [str(python), "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout.strip()


def _read_junit(path: Path, outcome: Outcome) -> None:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total = int(suite.get("tests", 0))
    outcome.failed = int(suite.get("failures", 0))
    outcome.errors = int(suite.get("errors", 0))
    outcome.skipped = int(suite.get("skipped", 0))
    outcome.passed = total - outcome.failed - outcome.errors - outcome.skipped
    for case in suite.iter("testcase"):
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            message = (problem.get("message") or "").splitlines()[:1]
            outcome.failures.append(f"{case.get('name')}: {' '.join(message)[:300]}")


def run_version(version: str, root: Path) -> Outcome:
    outcome = Outcome(version)
    start = time.monotonic()
    try:
        python = _venv(version, root)
    except subprocess.SubprocessError as error:
        outcome.note = f"install failed: {error}"
        return outcome
    outcome.installed = _installed(python)
    junit = root / f"junit-{version}.xml"
    env_cmd = [
        str(python), "-m", "pytest", *TESTS, "-p", "no:cacheprovider", "-q",
        f"--junitxml={junit}", "-o", "addopts=",
    ]  # fmt: skip
    try:
        subprocess.run(
            env_cmd,
            cwd=REPO,
            env={**_clean_env(), "PYTHONPATH": str(REPO)},
            timeout=TEST_TIMEOUT_S,
            stdout=(root / f"log-{version}.txt").open("w"),
            stderr=subprocess.STDOUT,
        )
    except subprocess.TimeoutExpired:
        outcome.note = f"timed out after {TEST_TIMEOUT_S} s"
    if junit.exists():
        _read_junit(junit, outcome)
    outcome.seconds = round(time.monotonic() - start, 1)
    return outcome


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="+", default=list(VERSIONS))
    parser.add_argument("--root", type=Path, default=REPO / "build" / "ray-matrix")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "ray-matrix" / "matrix.json")
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    outcomes = []
    print(f"{'ray':8}  {'installed':9}  {'passed':>6}  {'failed':>6}  {'errors':>6}  {'s':>6}")
    for version in args.versions:
        outcome = run_version(version, args.root)
        outcomes.append(outcome)
        print(
            f"{version:8}  {outcome.installed or '-':9}  {outcome.passed:6}  {outcome.failed:6}  "
            f"{outcome.errors:6}  {outcome.seconds:6.0f}  {outcome.note}",
            flush=True,
        )
        for failure in outcome.failures:
            print(f"    {failure}", flush=True)
        args.out.write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
