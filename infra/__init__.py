"""The Pulumi program of ray-tpu: a GKE cluster, TPU slice node pools and KubeRay objects.

=====================  ===================================================================
Room                   What lives there
=====================  ===================================================================
``infra.config``       the stack's ``config:``, read once into frozen dataclasses (no Pulumi)
``infra.manifests``    pure builders of Kubernetes objects: KubeRay kinds, Kueue, dashboards,
                       alert rules, IAP (no Pulumi import)
``infra.components``   every ``ComponentResource``, one per file, ``parent=self``
=====================  ===================================================================

At the top: :mod:`infra.program` (``declare(config)``, the body of ``__main__.py``, which only
wires components), :mod:`infra.offline` (the program under Pulumi mocks, for tests and
``raytpu preview``) and :mod:`infra.worker_image` (what the Ray image must hold).
"""
