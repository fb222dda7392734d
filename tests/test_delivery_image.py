"""The worker image (Dockerfile) and the vLLM image (Dockerfile.vllm) agree with pyproject.toml,
the installed Ray's metadata and the stacks; they cannot be built here (no registry), so these
checks are what keeps them honest."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from infra.config.stack import load_stack
from raytpu import entrypoints
from raytpu.ray_versions import VLLM_PYTHON, VLLM_TPU_FOR_RAY, is_stock_ray_image

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = (REPO / "Dockerfile").read_text()
VLLM_DOCKERFILE = (REPO / "Dockerfile.vllm").read_text()
STACKS = sorted(REPO.glob("Pulumi.*.yaml"))


def _instructions(keyword: str, dockerfile: str = DOCKERFILE) -> list[str]:
    """Arguments of each ``KEYWORD`` instruction (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    return [line.split(None, 1)[1] for line in text.splitlines() if line.startswith(keyword + " ")]


def _ray_pin() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (pin,) = [d for d in project["dependencies"] if d.startswith("ray[")]
    return pin.split("==")[1]


def _arg(name: str, dockerfile: str = DOCKERFILE) -> str:
    (arg,) = [a for a in _instructions("ARG", dockerfile) if a.startswith(f"{name}=")]
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


def test_installs_the_tpu_and_notebook_extras_without_ray_or_pulumi() -> None:
    (install,) = [r for r in _instructions("RUN") if "image_requirements" in r]
    assert "pip install --no-cache-dir -r /tmp/worker-requirements.txt" in install
    requirements = entrypoints.image_requirements()
    assert any(r.startswith("jax[tpu]") for r in requirements)
    # ray-tpu:notebooks runs `python -m jupyterlab` in this image by default.
    assert "jupyterlab==4.6.6" in requirements
    assert "jupyterlab==4.6.6" not in entrypoints.worker_requirements()  # not in every job's env
    assert not any(r.startswith(("ray", "pulumi")) for r in requirements)


def test_jupyterlab_does_not_make_every_ray_process_build_a_grammar() -> None:
    """jupyter-events asks for jsonschema[format-nongpl], which from jsonschema 4.24 imports
    rfc3987-syntax (a Lark grammar built at import: +1.4 s in every process that imports ray).
    The notebook extra keeps jsonschema below it, in this env and in the image."""
    assert "jsonschema>=4.23,<4.24" in entrypoints.image_requirements()
    probe = "import sys, ray; print(sorted({'rfc3987_syntax', 'lark'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", f"import ray loaded {done.stdout.strip()}"


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


# ------------------------------------------------------------------------- Dockerfile.vllm
def _ray_llm_pin() -> str:
    """The vLLM version the installed Ray's ``llm`` extra pins (``vllm[audio]==0.29.0``)."""
    (pin,) = [
        r for r in importlib.metadata.requires("ray") if re.match(r"vllm\b", r) and "llm" in r
    ]
    return re.search(r"==([0-9.]+)", pin).group(1)


def test_vllm_tpu_pin_is_the_vllm_of_ray_s_llm_extra() -> None:
    import ray

    assert ray.__version__ == _ray_pin()
    assert VLLM_TPU_FOR_RAY[ray.__version__] == _ray_llm_pin()


def test_vllm_dockerfile_builds_the_pin_on_python_3_12() -> None:
    assert _instructions("FROM", VLLM_DOCKERFILE) == ["rayproject/ray:${RAY_VERSION}-py312"]
    assert VLLM_PYTHON == (3, 12)
    assert _arg("RAY_VERSION", VLLM_DOCKERFILE) == _ray_pin()
    assert _arg("VLLM_TPU", VLLM_DOCKERFILE) == VLLM_TPU_FOR_RAY[_ray_pin()]
    (run,) = _instructions("RUN", VLLM_DOCKERFILE)
    assert "m.version('vllm-tpu') == '${VLLM_TPU}'" in run
    # The command that writes the requirements, run here on this Ray: what vllm_requirements says.
    code = re.match(r'python -c "([^"]+)" "\$\{VLLM_TPU\}"', run).group(1)
    done = subprocess.run(
        [sys.executable, "-c", code, "0.29.0"], cwd=REPO, capture_output=True, text=True, check=True
    )
    requires = importlib.metadata.requires("ray")
    assert done.stdout.splitlines() == entrypoints.vllm_requirements(requires, "0.29.0")
    assert "ray.__version__ == '${RAY_VERSION}'" in run


def test_vllm_requirements_are_ray_serve_llm_s_without_cuda_vllm_and_nixl() -> None:
    ray_requires = importlib.metadata.requires("ray")
    wanted = entrypoints.vllm_requirements(ray_requires, "0.29.0")
    assert wanted[-1] == "vllm-tpu==0.29.0"
    names = [re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for r in wanted[:-1]]
    assert not {"vllm", "nixl", "nixl-cu13"} & set(names)
    assert {"fastapi", "hf_transfer", "pandas", "uvicorn"} <= set(names)
    assert not [r for r in wanted if "extra" in r]
    llm_extra = [r for r in ray_requires if re.search(r"extra == .llm.", r)]
    assert len(wanted) == len(llm_extra) - 3 + 1  # vllm, nixl, nixl-cu13 out; vllm-tpu in


MARKERS = [
    ("extra-only", 'mmh3; extra == "llm"', ["mmh3"]),
    ("python-and-extra", 'py-spy>=0.4.0; python_version >= "3.12" and extra == "llm"',
     ['py-spy>=0.4.0; python_version >= "3.12"']),
    ("extra-first", "jinja2; extra == 'llm' and sys_platform == \"linux\"",
     ['jinja2; sys_platform == "linux"']),
    ("other-extra", 'pytest; extra == "test"', []),
    ("no-marker", "numpy", []),
    ("cuda-vllm", 'vllm[audio]==0.29.0; extra == "llm"', []),
]  # fmt: skip


@pytest.mark.parametrize(("line", "kept"), [m[1:] for m in MARKERS], ids=[m[0] for m in MARKERS])
def test_vllm_requirements_keep_markers_but_the_extra(line: str, kept: list[str]) -> None:
    assert entrypoints.vllm_requirements([line], "0.29.0") == [*kept, "vllm-tpu==0.29.0"]


def test_worker_image_cli_names_the_vllm_image_when_a_service_serves_with_vllm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from infra import worker_image
    from infra.config.stack import parse_config

    raw = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    assert worker_image.main(["dev", "--tag", "abc"]) == 0
    assert "vllmImage=" not in capsys.readouterr().out
    raw["ray-tpu:rayServices"][0].update(
        engine="vllm", llm={"modelId": "m", "modelSource": "org/m"}
    )
    raw["ray-tpu:rayServices"][0].pop("importPath", None)
    monkeypatch.setattr(worker_image, "load_stack", lambda *_, **__: parse_config(raw))
    assert worker_image.main(["dev"]) == 0
    out = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    stack = parse_config(raw)
    assert out["vllmImage"] == stack.vllm_image
    assert out["vllmImage"].endswith(
        f"/ray-vllm:{_ray_pin()}-py312-vllm-tpu0.29.0-{stack.image.tag}"
    )
    assert out["vllmTpu"] == "0.29.0"
