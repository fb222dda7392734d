"""The worker image (Dockerfile) agrees with pyproject.toml and the stacks; it cannot be built
here (no registry), so these checks are what keeps it honest."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from infra.config import load_stack
from raytpu import entrypoints
from raytpu.ray_versions import is_stock_ray_image

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text()
STACKS = sorted(REPO.glob("Pulumi.*.yaml"))


def _instructions(keyword: str) -> list[str]:
    """Arguments of each ``KEYWORD`` instruction (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(keyword + " ")]


def _ray_pin() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["dependencies"] if d.startswith("ray[")]
    return pin.split("==")[1]


def _arg(name: str) -> str:
    (arg,) = [a for a in _instructions("ARG") if a.startswith(f"{name}=")]
    return arg.split("=", 1)[1]


def test_base_image_is_the_pinned_ray_release() -> None:
    assert _instructions("FROM") == ["rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}"]
    assert _arg("RAY_VERSION") == _ray_pin()
    assert _arg("PYTHON_TAG") == "py311"
    # The version check inside the image follows the build argument.
    assert "ARG RAY_VERSION" in DOCKERFILE.split("FROM", 1)[1]
    assert "ray.__version__ == '${RAY_VERSION}'" in DOCKERFILE


@pytest.mark.parametrize("stack_file", STACKS, ids=[p.stem for p in STACKS])
def test_stacks_run_the_built_image(stack_file: Path) -> None:
    """No stack runs the stock image: rayImage unset, so the program runs the Dockerfile build."""
    config = yaml.safe_load(stack_file.read_text())["config"]
    assert "ray-tpu:rayImage" not in config
    stack = load_stack(stack_file.stem.split(".", 1)[1])
    assert not is_stock_ray_image(stack.ray_image)
    assert stack.ray_image.endswith(f":{_ray_pin()}-{_arg('PYTHON_TAG')}-{stack.image.tag}")


@pytest.mark.parametrize("stack_file", STACKS, ids=[p.stem for p in STACKS])
def test_stacks_run_the_ray_version_of_the_image(stack_file: Path) -> None:
    config = yaml.safe_load(stack_file.read_text())["config"]
    assert config["ray-tpu:rayVersion"] == _ray_pin()


def test_runs_as_a_non_root_user() -> None:
    users = _instructions("USER")
    assert users and users[-1] not in ("root", "0")


def test_installs_the_tpu_extra_without_ray_or_pulumi() -> None:
    (install,) = [r for r in _instructions("RUN") if "worker_requirements" in r]
    assert "pip install --no-cache-dir -r /tmp/worker-requirements.txt" in install
    requirements = entrypoints.worker_requirements()
    assert any(r.startswith("jax[tpu]") for r in requirements)
    assert not any(r.startswith(("ray", "pulumi")) for r in requirements)


def test_copied_sources_exist_and_the_context_is_an_allowlist() -> None:
    for copy in _instructions("COPY"):
        sources = [s for s in copy.split()[:-1] if not s.startswith("--")]
        for source in sources:
            assert (REPO / source).exists(), source
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == {"pyproject.toml", "README.md", "raytpu", "raytpu_cli", "workloads"}
