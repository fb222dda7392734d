"""ray-tpu's core: what every layer and the TPU worker image import.

The one TPU catalog (:mod:`raytpu.catalog`), Ray's label and port names (:mod:`raytpu.ray_names`),
the Ray version rule (:mod:`raytpu.ray_versions`), the job contract (:mod:`raytpu.entrypoints`) and
the stack-outputs reader (:mod:`raytpu.stack_outputs`). It imports none of ``infra``, ``policies``,
``workloads``, ``raytpu_cli``, pulumi or ray at module level.
"""
