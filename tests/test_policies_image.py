"""``image-has-the-code``: a RayService / RayJob that starts this project's code must not run the
stock rayproject/ray image. The program's own resources under mocks, then hand-written ones."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import offline
from infra.config.stack import parse_config
from policies.evaluation import evaluate
from policies.rules.image import check_image_has_code
from raytpu_cli.main import main

REPO = Path(__file__).resolve().parents[1]
STOCK = "rayproject/ray:2.60.0-py311"
BUILT = "us-east5-docker.pkg.dev/p/ray-tpu/ray:2.60.0-py311-0123456789ab"
POLICY = "image-has-the-code"


def _dev_raw() -> dict[str, Any]:
    return copy.deepcopy(yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"])


def _violations(raw: dict[str, Any]) -> list[Any]:
    resources, _ = offline.run_program(parse_config(raw), stack="dev")
    return [v for v in evaluate(resources) if v.policy == POLICY]


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_shipped_stacks_run_the_built_image(stack: str) -> None:
    resources, _ = offline.run_stack(stack)
    assert [v for v in evaluate(resources) if v.policy == POLICY] == []


def test_the_program_with_the_stock_image_is_flagged() -> None:
    raw = _dev_raw()
    raw["ray-tpu:rayImage"] = STOCK
    found = _violations(raw)
    assert {v.resource.name for v in found} == {"rayservice-serve"}
    fields = sorted(v.message.split(":", 1)[0] for v in found)
    assert fields == [
        "spec.rayClusterConfig.headGroupSpec.template.spec.containers[0].image",
        "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].image",
    ]
    message = found[0].message
    assert "workloads.serve:app" in message and "Dockerfile" in message
    assert "ray-tpu:imageTag" in message


def test_a_program_rayjob_with_the_stock_image_is_flagged() -> None:
    raw = _dev_raw()
    raw["ray-tpu:rayImage"] = STOCK
    raw["ray-tpu:rayServices"] = []
    raw["ray-tpu:slices"][0]["count"] = 2
    raw["ray-tpu:rayJobs"] = [{"name": "run", "slice": "train", "replicas": 1}]
    found = _violations(raw)
    assert {v.resource.name for v in found} == {"rayjob-run"}
    assert "python -m raytpu_cli train" in found[0].message


def test_preview_exits_1_on_the_stock_image(tmp_path: Path, capsys) -> None:
    raw = _dev_raw()
    raw["ray-tpu:rayImage"] = STOCK
    (tmp_path / "Pulumi.yaml").write_text((REPO / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": raw}))
    assert main(["preview", "dev", "--project-dir", str(tmp_path)]) == 1
    assert POLICY in capsys.readouterr().out


def _service(image: str, import_path: str, runtime_env: dict[str, Any] | None = None) -> dict:
    app: dict[str, Any] = {"name": "app", "import_path": import_path}
    if runtime_env is not None:
        app["runtime_env"] = runtime_env
    pod = {"containers": [{"name": "ray", "image": image}]}
    return {
        "kind": "RayService",
        "spec": {
            "serveConfigV2": yaml.safe_dump({"applications": [app]}),
            "rayClusterConfig": {
                "rayVersion": "2.60.0",
                "headGroupSpec": {"template": {"spec": pod}},
                "workerGroupSpecs": [{"replicas": 1.0, "template": {"spec": pod}}],
            },
        },
    }


def _job(image: str, entrypoint: str, runtime_env: dict[str, Any] | None = None) -> dict:
    pod = {"containers": [{"name": "ray", "image": image}]}
    spec: dict[str, Any] = {
        "entrypoint": entrypoint,
        "rayClusterSpec": {"headGroupSpec": {"template": {"spec": pod}}},
    }
    if runtime_env is not None:
        spec["runtimeEnvYAML"] = yaml.safe_dump(runtime_env)
    return {"kind": "RayJob", "spec": spec}


CODE_AND_PACKAGES = {"working_dir": "gs://b/code.zip", "pip": ["jax[tpu]"]}

# (id, props, violations expected)
CASES = [
    ("service-stock-serve-app", _service(STOCK, "workloads.serve:app"), 2),
    ("service-docker-hub-spelling", _service("docker.io/rayproject/ray:2.60.0-py311", "workloads.serve:app"), 2),
    ("service-built-image", _service(BUILT, "workloads.serve:app"), 0),
    ("service-stock-other-app", _service(STOCK, "serve_tpu:app"), 0),
    ("service-stock-code-in-runtime-env", _service(STOCK, "workloads.serve:app", CODE_AND_PACKAGES), 0),
    ("service-stock-code-without-packages", _service(STOCK, "workloads.serve:app", {"working_dir": "."}), 2),
    ("job-stock-raytpu-cli", _job(STOCK, "python -m raytpu_cli train --steps 10"), 1),
    ("job-stock-raytpu-command", _job(STOCK, "raytpu catalog v6e 4x4"), 1),
    ("job-stock-own-script", _job(STOCK, "python my_train.py"), 0),
    ("job-stock-code-in-runtime-env", _job(STOCK, "python -m workloads.training.driver", CODE_AND_PACKAGES), 0),
    ("job-built-image", _job(BUILT, "python -m raytpu_cli train"), 0),
    ("raycluster-is-not-judged", {"kind": "RayCluster", "spec": {"headGroupSpec": {}}}, 0),
    ("unreadable-serve-config", {"kind": "RayService", "spec": {"serveConfigV2": "{["}}, 0),
]  # fmt: skip


@pytest.mark.parametrize(("props", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_table(props: dict[str, Any], expected: int) -> None:
    found = check_image_has_code(props)
    assert len(found) == expected, found
    for message in found:
        assert "stock rayproject/ray image" in message and "Dockerfile" in message
