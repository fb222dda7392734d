"""Stack configuration: the ``config:`` of ``Pulumi.<stack>.yaml``, read once and validated.

Stdlib + PyYAML only (no pulumi import at module level), so tests, the policy pack and the
``raytpu`` command can read a stack without the Pulumi engine.

Every problem is collected before anything is declared, and each one names the key path, the bad
value and the valid values, in the words of :func:`raytpu.errors.invalid`::

    invalid("ray-tpu:slices[1].topology", "4x5", ["1x1", "2x2", "2x4", "4x4", ...])

Modules, by concern: :mod:`~infra.config.schema` (the frozen dataclasses the program reads),
:mod:`~infra.config.reader` (the key-path reader kit), :mod:`~infra.config.gcp_rules` (GCP, GKE and
Ray value rules), one parser per section (:mod:`~infra.config.cluster`,
:mod:`~infra.config.slices`, :mod:`~infra.config.ray_objects`), :mod:`~infra.config.stack` (the
whole stack, loading a stack file), :mod:`~infra.config.cross_rules` (the rules across sections) and
:mod:`~infra.config.pulumi_config` (the stack being deployed, from the Pulumi engine).

Glossary: a **slice** is one TPU topology on its hosts (one GKE node pool); ``count`` identical
slices become ``count`` node pools. A **RayCluster** / **RayService** worker group has one
``replica`` per slice and ``numOfHosts`` = hosts per slice.
"""
