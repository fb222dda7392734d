"""The serving stack keys, offline: ``rayServices[].engine: vllm`` (Ray Serve LLM with vLLM's TPU
backend) and ``rayServices[].fallback``: good values, each bad value and its message, and the
Serve config and pods the program would declare."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.config.stack import parse_config
from infra.manifests import kuberay
from raytpu import entrypoints

REPO = Path(__file__).resolve().parents[1]
RS = "ray-tpu:rayServices"
LLM = {"modelId": "qwen-7b", "modelSource": "Qwen/Qwen2.5-7B-Instruct", "maxModelLen": 8192}
FALLBACK = {
    "kind": "openai",
    "url": "https://llm.example.com/v1",
    "model": "small-model",
    "apiKeySecret": "llm-fallback/api-key",
}


@pytest.fixture
def raw() -> dict[str, Any]:
    config = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())["config"]
    return copy.deepcopy(config)


def _service(raw: dict[str, Any], **keys: Any) -> dict[str, Any]:
    service = raw[RS][0]
    for key, value in keys.items():
        if value is None:
            service.pop(key, None)
        else:
            service[key] = value
    return raw


def test_engine_vllm_declares_a_ray_serve_llm_app_on_the_slice_s_chips(raw) -> None:
    from ray.serve.schema import ServeDeploySchema

    stack = parse_config(_service(raw, engine="vllm", importPath=None, llm=LLM))
    service = stack.ray_services[0]
    config = yaml.safe_load(kuberay.serve_config_v2(stack, service))
    (app,) = config["applications"]
    assert app["import_path"] == entrypoints.LLM_IMPORT_PATH == "ray.serve.llm:build_openai_app"
    (llm,) = app["args"]["llm_configs"]
    assert llm["model_loading_config"] == {
        "model_id": "qwen-7b",
        "model_source": "Qwen/Qwen2.5-7B-Instruct",
    }
    assert llm["accelerator_type"] == "TPU-V6E"
    assert llm["engine_kwargs"] == {
        "tensor_parallel_size": 4,  # v6e 2x2: every chip of the serving slice
        "enable_prefix_caching": True,
        "max_model_len": 8192,
    }
    assert "RAYTPU_CHECKPOINT_DIR" not in app["runtime_env"]["env_vars"]
    ServeDeploySchema(**config)  # what KubeRay hands to Serve
    # Its pods run the image Dockerfile.vllm builds, the other Ray objects the worker image.
    spec = kuberay.ray_service_spec(stack, service)
    cluster = spec["rayClusterConfig"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    images = {g["template"]["spec"]["containers"][0]["image"] for g in pods}
    assert images == {stack.vllm_image}
    assert stack.vllm_image == (
        f"{stack.registry}/ray-vllm:2.60.0-py312-vllm-tpu0.29.0-{stack.image.tag}"
    )
    assert stack.image_for(stack.ray_clusters[0]) == stack.ray_image != stack.vllm_image


def test_vllm_serves_an_exported_folder_from_the_stack_s_bucket(raw) -> None:
    """``modelSource: gs://<stack bucket>/FOLDER`` (what ``raytpu train --export-to`` writes)
    goes to Ray Serve LLM as it is: Ray 2.60 turns a remote path into its GCS mirror config
    (``download_utils``: ``is_remote_path`` -> ``CloudMirrorConfig(bucket_uri=...)``), read by
    the pods' service account, the one the stack grants that bucket."""
    from ray.llm._internal.common.utils.cloud_utils import CloudMirrorConfig, is_remote_path

    folder = "gs://ray-tpu-dev-ckpt/models/tiny-trained"
    llm = {**LLM, "modelSource": folder}
    stack = parse_config(_service(raw, engine="vllm", importPath=None, llm=llm))
    service = stack.ray_services[0]
    (app,) = yaml.safe_load(kuberay.serve_config_v2(stack, service))["applications"]
    (config,) = app["args"]["llm_configs"]
    source = config["model_loading_config"]["model_source"]
    assert source == folder and is_remote_path(source)
    assert CloudMirrorConfig(bucket_uri=source).storage_type == "gcs"
    pod = kuberay.ray_service_spec(stack, service)["rayClusterConfig"]["headGroupSpec"]
    assert pod["template"]["spec"]["serviceAccountName"] == stack.storage.service_account


def test_fallback_reaches_the_replicas_and_its_key_comes_from_the_secret(raw) -> None:
    from workloads.serving.app import fallback_from_env
    from workloads.serving.fallback import FallbackConfig

    stack = parse_config(_service(raw, fallback={**FALLBACK, "probeAfterS": 2}))
    service = stack.ray_services[0]
    (app,) = yaml.safe_load(kuberay.serve_config_v2(stack, service))["applications"]
    encoded = app["runtime_env"]["env_vars"][entrypoints.SERVE_FALLBACK_ENV]
    assert fallback_from_env(encoded) == FallbackConfig(
        "openai",
        "https://llm.example.com/v1",
        "small-model",
        entrypoints.FALLBACK_KEY_ENV,
        timeout_s=30.0,
        max_attempts=3,
        probe_after_s=2.0,
    )
    spec = kuberay.ray_service_spec(stack, service)
    pods = [
        spec["rayClusterConfig"]["headGroupSpec"],
        *spec["rayClusterConfig"]["workerGroupSpecs"],
    ]
    for group in pods:
        (container,) = group["template"]["spec"]["containers"]
        key = [e for e in container["env"] if e["name"] == entrypoints.FALLBACK_KEY_ENV]
        assert key == [
            {
                "name": entrypoints.FALLBACK_KEY_ENV,
                "valueFrom": {"secretKeyRef": {"name": "llm-fallback", "key": "api-key"}},
            }
        ]
    assert "sk-" not in json.dumps(spec)


BAD = [
    ("engine", {"engine": "tgi"}, "engine: 'tgi' is not valid", "builtin, vllm"),
    ("vllm-without-llm", {"engine": "vllm", "importPath": None}, "llm: is required", "mapping"),
    ("llm-without-vllm", {"llm": LLM}, "llm: ", "absent unless engine is vllm"),
    (
        "vllm-other-import-path",
        {"engine": "vllm", "llm": LLM},
        "importPath: 'workloads.serve:app' is not valid",
        "ray.serve.llm:build_openai_app",
    ),
    (
        "vllm-multi-host-slice",
        {"engine": "vllm", "importPath": None, "llm": LLM, "slice": "train"},
        "slice: 'train' is not valid",
        "a single-host serving slice",
    ),
    (
        "model-len",
        {"engine": "vllm", "importPath": None, "llm": {**LLM, "maxModelLen": 64}},
        "llm.maxModelLen: 64 is not valid",
        "128..131072",
    ),
    (
        "fallback-kind",
        {"fallback": {**FALLBACK, "kind": "gpu"}},
        "fallback.kind: 'gpu' is not valid",
        "openai, deployment",
    ),
    (
        "fallback-probe-after",
        {"fallback": {**FALLBACK, "probeAfterS": -1}},
        "fallback.probeAfterS: -1 is not valid",
        "seconds, 0..600",
    ),
    (
        "fallback-plain-http",
        {"fallback": {**FALLBACK, "url": "http://llm.example.com/v1"}},
        "fallback.url: 'http://llm.example.com/v1' is not valid",
        "https://",
    ),
    (
        "fallback-key-value-not-a-secret-ref",
        {"fallback": {**FALLBACK, "apiKeySecret": "sk-live-123"}},
        "fallback.apiKeySecret: 'sk-live-123' is not valid",
        "name/key of a Kubernetes secret",
    ),
    (
        "model-source-other-bucket",
        {"engine": "vllm", "importPath": None, "llm": {**LLM, "modelSource": "gs://elsewhere/m"}},
        "llm.modelSource: 'gs://elsewhere/m' is not valid",
        "the Ray pods' service account reads only gs://ray-tpu-dev-ckpt",
    ),
    (
        "model-source-bucket-root",
        {
            "engine": "vllm",
            "importPath": None,
            "llm": {**LLM, "modelSource": "gs://ray-tpu-dev-ckpt"},
        },
        "llm.modelSource: 'gs://ray-tpu-dev-ckpt' is not valid",
        "the folder (config.json, safetensors, tokenizer.json) is missing",
    ),
    (
        "vllm-on-the-worker-image",
        {"engine": "vllm", "importPath": None, "llm": LLM, "image": "r/ray:2.60.0-py311-abc"},
        "image: 'r/ray:2.60.0-py311-abc' is not valid",
        "an image with the pinned vllm-tpu",
    ),
    (
        "vllm-tpu-other-release",
        {
            "engine": "vllm",
            "importPath": None,
            "llm": LLM,
            "image": "r/ray-vllm:2.60.0-py312-vllm-tpu0.32.0-abc",
        },
        "image: 'r/ray-vllm:2.60.0-py312-vllm-tpu0.32.0-abc' is not valid",
        "vllm-tpu 0.32.0, not the 0.29.0 Ray 2.60.0 pins",
    ),
    (
        "fallback-with-vllm",
        {"engine": "vllm", "importPath": None, "llm": LLM, "fallback": FALLBACK},
        "fallback: ",
        "built-in engine only",
    ),
]


@pytest.mark.parametrize(("keys", "shown", "valid"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_serving_keys_name_the_field_and_the_valid_values(raw, keys, shown, valid) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_service(raw, **keys))
    matching = [e for e in caught.value.errors if f"{RS}[0].{shown}" in e]
    assert matching, caught.value.errors
    assert valid in matching[0].split("; valid: ", 1)[1], matching[0]


# ------------------------------------------------------------------ policy on the generated object
def _llm_props(raw: dict[str, Any], edit=None, image: str | None = None) -> dict[str, Any]:
    stack = parse_config(_service(raw, engine="vllm", importPath=None, llm=LLM))
    spec = kuberay.ray_service_spec(stack, stack.ray_services[0])
    if image is not None:
        (worker,) = spec["rayClusterConfig"]["workerGroupSpecs"]
        worker["template"]["spec"]["containers"][0]["image"] = image
    if edit is not None:
        config = yaml.safe_load(spec["serveConfigV2"])
        edit(config["applications"][0]["args"]["llm_configs"][0])
        spec["serveConfigV2"] = yaml.safe_dump(config)
    return {"kind": "RayService", "spec": spec}


def _kwargs(key: str, value: Any):
    return lambda llm: llm["engine_kwargs"].__setitem__(key, value)


POLICY = [
    ("as-generated", None, []),
    ("tp-8-on-4-chips", _kwargs("tensor_parallel_size", 8), ["tensor_parallel_size: 8 is not"]),
    ("tp-1", _kwargs("tensor_parallel_size", 1), ["set it to 4"]),
    ("no-prefix-cache", _kwargs("enable_prefix_caching", False), ["enable_prefix_caching: False"]),
    (
        "wrong-accelerator",
        lambda llm: llm.__setitem__("accelerator_type", "TPU-V5P"),
        ["accelerator_type: 'TPU-V5P' is not the serving slice's TPU-V6E"],
    ),
]


@pytest.mark.parametrize(("edit", "fragments"), [p[1:] for p in POLICY], ids=[p[0] for p in POLICY])
def test_llm_engine_policy_on_the_declared_rayservice(raw, edit, fragments) -> None:
    from policies.rules.serve_llm import check_llm_engine

    violations = check_llm_engine(_llm_props(raw, edit))
    assert len(violations) == len(fragments), violations
    for violation, fragment in zip(violations, fragments, strict=True):
        assert fragment in violation and "spec.serveConfigV2 applications[0]" in violation


WORKERS_IMAGE = "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].image"
IMAGES = [
    ("pinned", "r/ray-vllm:2.60.0-py312-vllm-tpu0.29.0-abc", []),
    ("templated", "$VLLM_IMAGE", []),
    (
        "worker-image",
        "r/ray:2.60.0-py311-abc",
        ["names no vllm-tpu version (wanted vllm-tpu0.29.0)", "names py311, not py312"],
    ),
    (
        "newer-vllm-tpu",
        "r/ray-vllm:2.60.0-py312-vllm-tpu0.32.0-abc",
        ["names vllm-tpu 0.32.0, not the 0.29.0 Ray 2.60.0 pins"],
    ),
    (
        "ray-without-a-pin",
        "r/ray-vllm:2.59.0-py312-vllm-tpu0.29.0-abc",
        ["Ray 2.59.0 has no vllm-tpu pin here (pinned for Ray 2.60.0)"],
    ),
]


@pytest.mark.parametrize(
    ("image", "fragments"), [i[1:] for i in IMAGES], ids=[i[0] for i in IMAGES]
)
def test_llm_engine_policy_checks_the_pods_image(raw, image, fragments) -> None:
    from policies.rules.serve_llm import check_llm_engine

    violations = check_llm_engine(_llm_props(raw, image=image))
    assert len(violations) == min(1, len(fragments)), violations
    for fragment in fragments:
        assert violations[0].startswith(f"{WORKERS_IMAGE}: {image!r} cannot serve"), violations
        assert fragment in violations[0] and "Dockerfile.vllm" in violations[0]


def test_llm_engine_policy_ignores_the_built_in_app_and_refuses_bad_yaml(raw) -> None:
    from policies.rules.serve_llm import check_llm_engine

    stack = parse_config(raw)
    props = {"kind": "RayService", "spec": kuberay.ray_service_spec(stack, stack.ray_services[0])}
    assert check_llm_engine(props) == []
    props["spec"]["serveConfigV2"] = "applications: [unclosed"
    (violation,) = check_llm_engine(props)
    assert violation.startswith("spec.serveConfigV2: not valid YAML")
