# The Ray image for TPU hosts (and the head): pinned Ray + this project + jax[tpu] (libtpu).
# Every stack runs it by default: REGION-docker.pkg.dev/PROJECT/ray-tpu/ray:<RAY_VERSION>-<PYTHON_TAG>-<imageTag>
# (`python -m infra.worker_image STACK --tag TAG` prints the exact reference). By hand:
#
#   TAG=$(git rev-parse HEAD | cut -c1-12)
#   IMAGE=$(.venv/bin/python -m infra.worker_image dev --tag "$TAG" | sed -n 's/^image=//p')
#   docker build --build-arg RAY_VERSION=2.60.0 --build-arg PYTHON_TAG=py311 -t "$IMAGE" .
#   docker push "$IMAGE" && pulumi config set ray-tpu:imageTag "$TAG" && pulumi up
#
# The deploy workflow (.github/workflows/deploy.yml) does the same for each stack.
# tpu7x (Ironwood) needs jax[tpu] >= 0.8.2 on Python 3.12 (ray-project/ray#62402): build with
# --build-arg PYTHON_TAG=py312 and set ray-tpu:pythonVersion "3.12" (the stack config refuses a
# tpu7x slice on a py311 image).
#
# Base: the pinned CPU image of the Ray version the stacks run (ray-tpu:rayVersion, and the
# exact `ray==` pin in pyproject.toml). Ray also publishes `-tpu` variants (built since 2026,
# ray-project/ray#61173); whether `2.60.0-py311-tpu` exists was not verified here, and those
# images pinned jax 0.5.2 (ray-project/ray#62402), below this project's jax range. So: the plain
# image, and jax[tpu] from this project's `tpu` extra. libtpu comes from PyPI with jax >= 0.6.
#
# Not built in this repository's CI (no registry access there); tests/test_delivery_image.py
# checks that this file agrees with pyproject.toml and the stacks.
ARG RAY_VERSION=2.60.0
ARG PYTHON_TAG=py311
FROM rayproject/ray:${RAY_VERSION}-${PYTHON_TAG}
ARG RAY_VERSION

# rayproject/ray runs as the non-root user `ray` (uid 1000, group users) with its Python on PATH.
# GKE >= 1.28 gives TPU devices to unprivileged containers; the KubeRay samples that set
# runAsUser: 0 predate that (not verified on every generation: see docs/delivery.md).
USER ray
WORKDIR /home/ray/ray-tpu

# Dependencies first (a layer that changes only with pyproject.toml): the project's runtime
# dependencies, its `tpu` extra and its `notebook` extra (JupyterLab, for ray-tpu:notebooks),
# minus Ray (the image's own) and Pulumi (laptop and CI only).
COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users raytpu/__init__.py raytpu/catalog.py raytpu/entrypoints.py ./raytpu/
RUN python -c "from raytpu.entrypoints import image_requirements as r; print('\n'.join(r()))" \
        > /tmp/worker-requirements.txt \
    && pip install --no-cache-dir -r /tmp/worker-requirements.txt \
    && python -c "import ray; assert ray.__version__ == '${RAY_VERSION}', ray.__version__"

# The code the jobs import (`python -m raytpu_cli train`, `workloads.serve:app`, and the command
# layer for `python -m raytpu_cli ...` on the head); never infra/ or policies/ (Pulumi side).
COPY --chown=ray:users raytpu ./raytpu
COPY --chown=ray:users workloads ./workloads
COPY --chown=ray:users raytpu_cli ./raytpu_cli
RUN pip install --no-cache-dir --no-deps . \
    && python -c "import workloads.training.driver, workloads.serving.app, raytpu.catalog; print('ray-tpu image ok')"

ENV RAY_USAGE_STATS_ENABLED=0
