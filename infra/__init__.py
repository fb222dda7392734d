"""The Pulumi program of ray-tpu: a GKE cluster, TPU slice node pools and KubeRay objects.

- :mod:`infra.config`: the stack configuration, read once and validated (no pulumi import).
- :mod:`infra.kuberay`, :mod:`infra.rayjob_spec`: pure builders of RayCluster / RayService /
  RayJob manifests (no pulumi import); :mod:`infra.ray_kinds`: the three kinds as one table.
- :mod:`infra.program`: ``declare(config)``, the body of ``__main__.py``.
- :mod:`infra.offline`: runs the program under Pulumi mocks, for tests and checks.
- one ``ComponentResource`` per file: :mod:`infra.gke_cluster`, :mod:`infra.cpu_pool`,
  :mod:`infra.tpu_slice`, :mod:`infra.cloud_nat`, :mod:`infra.k8s_provider`,
  :mod:`infra.ray_object` (any KubeRay kind).
"""
