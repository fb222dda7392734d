"""The Pulumi program of ray-tpu: a GKE cluster, TPU slice node pools and KubeRay objects.

- :mod:`infra.config`: the stack configuration, read once and validated (no pulumi import).
- :mod:`infra.manifests.kuberay`, :mod:`infra.manifests.rayjob`: pure builders of RayCluster / RayService /
  RayJob manifests (no pulumi import); :mod:`infra.manifests.ray_kinds`: the three kinds as one table.
- :mod:`infra.program`: ``declare(config)``, the body of ``__main__.py``.
- :mod:`infra.offline`: runs the program under Pulumi mocks, for tests and checks.
- one ``ComponentResource`` per file: :mod:`infra.components.gke_cluster`, :mod:`infra.components.cpu_pool`,
  :mod:`infra.components.tpu_slice`, :mod:`infra.components.cloud_nat`, :mod:`infra.components.k8s_provider`,
  :mod:`infra.components.ray_object` (any KubeRay kind).
"""
