# The Ray image for TPU hosts (and the head): pinned Ray + this project + jax[tpu] (libtpu).
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/ray-tpu/ray:2.60.0-py311-$(git rev-parse --short HEAD) .
#   docker push  REGION-docker.pkg.dev/PROJECT/ray-tpu/ray:2.60.0-py311-<sha>
#   then set ray-tpu:rayImage to that tag in Pulumi.<stack>.yaml and `pulumi up`.
#
# Base: the pinned CPU image of the Ray version the stacks run (ray-tpu:rayVersion, and the
# exact `ray==` pin in pyproject.toml). Ray also publishes `-tpu` variants (built since 2026,
# ray-project/ray#61173); whether `2.60.0-py311-tpu` exists was not verified here, and those
# images pinned jax 0.5.2 (ray-project/ray#62402), below this project's jax range. So: the plain
# image, and jax[tpu] from this project's `tpu` extra. libtpu comes from PyPI with jax >= 0.6.
#
# Not built in this repository's CI (no registry access there); tests/test_delivery_image.py
# checks that this file agrees with pyproject.toml and the stacks.
ARG RAY_IMAGE=rayproject/ray:2.60.0-py311
FROM ${RAY_IMAGE}

# rayproject/ray runs as the non-root user `ray` (uid 1000, group users) with its Python on PATH.
# GKE >= 1.28 gives TPU devices to unprivileged containers; the KubeRay samples that set
# runAsUser: 0 predate that (not verified on every generation: see docs/delivery.md).
USER ray
WORKDIR /home/ray/ray-tpu

# Dependencies first (a layer that changes only with pyproject.toml): the project's runtime
# dependencies and its `tpu` extra, minus Ray (the image's own) and Pulumi (laptop and CI only).
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users raytpu/__init__.py raytpu/catalog.py raytpu/entrypoints.py ./raytpu/
RUN python -c "from raytpu.entrypoints import worker_requirements as w; print('\n'.join(w()))" \
        > /tmp/worker-requirements.txt \
    && pip install --no-cache-dir -r /tmp/worker-requirements.txt \
    && python -c "import ray; assert ray.__version__ == '2.60.0', ray.__version__"

# The code the jobs import (`python -m raytpu_cli train`, `workloads.serve:app`, and the command
# layer for `python -m raytpu_cli ...` on the head); never infra/ or policies/ (Pulumi side).
COPY --chown=ray:users raytpu ./raytpu
COPY --chown=ray:users workloads ./workloads
COPY --chown=ray:users raytpu_cli ./raytpu_cli
RUN pip install --no-cache-dir --no-deps . \
    && python -c "import workloads.train, workloads.serve, raytpu.catalog; print('ray-tpu image ok')"

ENV RAY_USAGE_STATS_ENABLED=0
