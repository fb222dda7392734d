"""``python -m infra.worker_image STACK [--tag TAG]``: the worker image a stack deploys.

Prints ``key=value`` lines for ``$GITHUB_OUTPUT`` (the deploy workflow builds, pushes and deploys
exactly this): ``image`` (``REGION-docker.pkg.dev/PROJECT/REPOSITORY/ray:<rayVersion>-py3XX-<tag>``),
``registry``, ``host`` (for ``gcloud auth configure-docker``), ``tag``, ``rayVersion`` and
``pythonTag`` (the Dockerfile's build arguments); and, when a RayService serves with
``engine: vllm`` on the default image, ``vllmImage`` and ``vllmTpu`` (``Dockerfile.vllm``'s tag and
build argument). Exit 2 on a bad stack config.
"""

from __future__ import annotations

import argparse
import sys

from infra.config.schema import ConfigError
from infra.config.stack import load_stack
from raytpu.ray_versions import VLLM_TPU_FOR_RAY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.worker_image", description=__doc__)
    parser.add_argument("stack")
    parser.add_argument("--tag", help="ray-tpu:imageTag to use (default: the stack's)")
    args = parser.parse_args(argv)
    try:
        config = load_stack(args.stack, image_tag=args.tag)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    assert config.image is not None
    print(f"image={config.ray_image}")
    print(f"registry={config.registry}")
    print(f"host={config.region}-docker.pkg.dev")
    print(f"tag={config.image.tag}")
    print(f"rayVersion={config.ray_version}")
    print(f"pythonTag={config.image.python_tag}")
    if any(s.engine == "vllm" and not s.image for s in config.ray_services):
        # The stack serves with Ray Serve LLM: the workflow builds Dockerfile.vllm too.
        print(f"vllmImage={config.vllm_image}")
        print(f"vllmTpu={VLLM_TPU_FOR_RAY[config.ray_version]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
