"""Rule: a RayService on the production engine path (Ray Serve LLM, vLLM) uses its serving slice.

For every application of ``spec.serveConfigV2`` whose ``import_path`` is Ray Serve LLM's
``build_openai_app``, each ``llm_configs[]`` entry must have:

- ``engine_kwargs.tensor_parallel_size`` equal to the chips of the RayService's TPU worker group
  (its shape from the GKE node selectors and ``google.com/tpu``, :mod:`raytpu.catalog`): fewer
  leaves chips idle, more cannot be placed;
- ``accelerator_type`` equal to that generation's Ray accelerator type (``TPU-V6E``...), so the
  engine's workers land on those hosts;
- ``engine_kwargs.enable_prefix_caching: true`` (shared system prompts skip their prefill);
- a single-host group: tensor parallel stays on one host's chips;
- pods (head and every worker group) in an image whose tag names the vllm-tpu that the tag's Ray
  version pins and Python 3.12 (``ray-vllm:2.60.0-py312-vllm-tpu0.29.0-<build>``, as
  ``Dockerfile.vllm`` tags it; :func:`raytpu.ray_versions.vllm_image_problems`).

Values not known at preview time are skipped; a Serve config that is not YAML is a violation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from policies.props import as_list, get, is_unknown
from policies.resources import pod_templates, worker_groups
from raytpu import catalog, generations
from raytpu.entrypoints import LLM_IMPORT_PATH
from raytpu.ray_versions import image_version, vllm_image_problems


def check_llm_engine(props: Mapping[str, Any]) -> list[str]:
    """Violations of the LLM engine settings of one RayService (none for other kinds/apps)."""
    text = get(props, "spec.serveConfigV2")
    if is_unknown(text) or not isinstance(text, str):
        return []
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return [f"spec.serveConfigV2: not valid YAML ({error}); write it as a YAML mapping"]
    apps = config.get("applications") if isinstance(config, Mapping) else None
    llm_apps = [
        (i, app)
        for i, app in enumerate(apps if isinstance(apps, list) else [])
        if isinstance(app, Mapping) and app.get("import_path") == LLM_IMPORT_PATH
    ]
    if not llm_apps:
        return []
    violations = _check_images(props)
    shape, problem = _group_shape(props)
    if problem:
        return [*violations, problem]
    if shape is None:
        return violations
    for index, app in llm_apps:
        configs = get(app, "args.llm_configs")
        if not isinstance(configs, list) or not configs:
            violations.append(
                f"spec.serveConfigV2 applications[{index}].args.llm_configs: missing; list one "
                "LLMConfig (model_loading_config, accelerator_type, engine_kwargs)"
            )
            continue
        for j, llm in enumerate(configs):
            where = f"spec.serveConfigV2 applications[{index}].args.llm_configs[{j}]"
            violations += _check_llm(where, llm if isinstance(llm, Mapping) else {}, shape)
    return violations


def _check_images(props: Mapping[str, Any]) -> list[str]:
    """Each pod's first container runs an image tagged with the pinned vllm-tpu and py312."""
    violations = []
    for template_path, pod in pod_templates(props, "RayService"):
        containers = as_list(get(pod, "containers"))
        if is_unknown(containers) or not isinstance(containers, list) or not containers:
            continue
        image = get(containers[0], "image")
        if not isinstance(image, str):
            continue
        ray_version, _ = image_version(image)
        if ray_version is None:
            continue  # the Ray version rule reports an image that names no Ray version
        problems = vllm_image_problems(image, ray_version)
        if problems:
            violations.append(
                f"{template_path}.containers[0].image: {image!r} cannot serve {LLM_IMPORT_PATH} "
                f"on TPU: {'; '.join(problems)}; run the image Dockerfile.vllm builds "
                "(leave rayServices[].image unset with engine vllm: the deploy workflow pushes "
                "ray-vllm:<rayVersion>-py312-vllm-tpu<pin>-<imageTag>)"
            )
    return violations


def _group_shape(props: Mapping[str, Any]) -> tuple[catalog.SliceShape | None, str]:
    groups = [g for g in worker_groups(props, "RayService") if g.requests_tpu]
    if not groups:
        return None, (
            "spec.rayClusterConfig.workerGroupSpecs: no TPU worker group, but serveConfigV2 "
            f"runs {LLM_IMPORT_PATH} for TPU; add the serving slice's TPU worker group"
        )
    group = groups[0]
    selector = group.node_selector if isinstance(group.node_selector, Mapping) else {}
    accelerator = selector.get(catalog.GKE_ACCELERATOR_LABEL)
    topology = selector.get(catalog.GKE_TOPOLOGY_LABEL)
    chips = group.tpu_limits
    if any(is_unknown(v) or v is None for v in (accelerator, topology, chips)):
        return None, ""  # not known yet, or the worker-group rule reports it
    try:
        shape = catalog.shape_from_gke_labels(str(accelerator), str(topology), int(chips))
    except (generations.CatalogError, ValueError, TypeError):
        return None, ""  # the worker-group rule reports a shape that does not exist
    if shape.multi_host:
        return None, (
            f"{group.path}: {shape.name} has {shape.hosts} hosts; the vLLM engine path serves "
            "tensor parallel on one host: use a single-host serving slice"
        )
    return shape, ""


def _check_llm(where: str, llm: Mapping[str, Any], shape: catalog.SliceShape) -> list[str]:
    violations = []
    tp = get(llm, "engine_kwargs.tensor_parallel_size")
    if not is_unknown(tp) and tp != shape.chips:
        violations.append(
            f"{where}.engine_kwargs.tensor_parallel_size: {tp!r} is not the {shape.chips} chips "
            f"of the serving slice ({shape.name}); set it to {shape.chips}"
        )
    accelerator = llm.get("accelerator_type")
    if not is_unknown(accelerator) and accelerator != shape.ray_accelerator_type:
        violations.append(
            f"{where}.accelerator_type: {accelerator!r} is not the serving slice's "
            f"{shape.ray_accelerator_type}; set it to {shape.ray_accelerator_type}"
        )
    caching = get(llm, "engine_kwargs.enable_prefix_caching")
    if not is_unknown(caching) and caching is not True:
        violations.append(
            f"{where}.engine_kwargs.enable_prefix_caching: {caching!r}; set it to true "
            "(requests that share a system prompt skip its prefill)"
        )
    return violations
