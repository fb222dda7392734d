"""A user's clone stands on its own: an export of HEAD (no ``../shared`` beside it, no CRD
variable) previews every stack and applies the policy pack, and names the skipped CRD checks once."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIPPED = "schema checks skipped:"


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``git archive HEAD`` unpacked alone in a fresh folder, committed as a user's clone."""
    root = tmp_path_factory.mktemp("user")
    archive = root / "head.tar"
    subprocess.run(
        ["git", "archive", "--format=tar", "-o", str(archive), "HEAD"],
        cwd=REPO,
        check=True,
        timeout=60,
    )
    target = root / "ray-tpu"
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="data")
    archive.unlink()
    # A clone is a git checkout: the worker image tag defaults to its commit (infra.config).
    git = ["git", "-c", "user.name=user", "-c", "user.email=user@example.com"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clone"]):
        subprocess.run([*git, *command], cwd=target, check=True, timeout=60)
    assert not (target.parent / "shared").exists() and not (target / ".crds").exists()
    return target


def _env(clone: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYTPU_")}
    env["PYTHONPATH"] = str(clone)  # the clone's code, not the checkout the venv points at
    return env


def _raytpu(clone: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "raytpu_cli.main", *args],
        cwd=clone,
        env=_env(clone),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_clone_runs_its_own_code(clone: Path) -> None:
    code = "import raytpu, infra; print(raytpu.__file__); print(infra.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=clone,
        env=_env(clone),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.split() == [
        str(clone / "raytpu" / "__init__.py"),
        str(clone / "infra" / "__init__.py"),
    ]


@pytest.mark.parametrize(
    ("args", "skipped"),
    [
        (("preview", "dev"), ("KubeRay", "GKE managed Prometheus")),
        (("preview", "prod"), ("KubeRay", "GKE managed Prometheus")),
        (("preview", "teams", "--project-dir", "tests/data"), ("KubeRay", "Kueue")),
    ],
    ids=["dev", "prod", "teams"],
)
def test_preview_and_policy_pack_pass_with_the_skipped_checks_named_once(
    clone: Path, args: tuple[str, ...], skipped: tuple[str, ...]
) -> None:
    result = _raytpu(clone, *args)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(SKIPPED)]
    assert len(lines) == 1, result.stdout[-2000:]
    for title in skipped:
        assert title in lines[0]
    assert "no policy violations" in result.stdout


ENTRYPOINT = """
import sys, yaml
from infra.offline import run_entrypoint
raw = yaml.safe_load(open(f"Pulumi.{sys.argv[1]}.yaml"))["config"]
run = run_entrypoint(raw, stack=sys.argv[1])
if run.error is not None:
    raise run.error
print(len(run.resources), "resources")
"""


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_pulumi_entrypoint_declares_without_crds(clone: Path, stack: str) -> None:
    """What ``pulumi preview`` / ``pulumi up`` run (``__main__.py``), under mocks, in the clone."""
    result = subprocess.run(
        [sys.executable, "-c", ENTRYPOINT, stack],
        cwd=clone,
        env=_env(clone),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[0]) > 20
