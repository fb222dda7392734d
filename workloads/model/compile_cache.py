"""JAX's persistent compilation cache for a process: a local folder or a ``gs://`` one.

Glossary:

- **compilation cache**: JAX's own cache of compiled XLA executables, keyed by a hash of the
  lowered program, the devices it runs on, the compile options and XLA flags, and the
  jax/jaxlib/backend versions (so another image or another slice shape misses; it never loads a
  stale executable). A jitted function whose key is there is deserialized instead of compiled;
  tracing and lowering still run. Set with the JAX config ``jax_compilation_cache_dir``; JAX
  opens it at the first compilation after that, through ``etils.epath`` (``gs://``: gcsfs, the
  same client as Orbax's small files, so ``STORAGE_EMULATOR_HOST`` points it at the emulator).
- **restart**: a new process of the same program (a training worker after a preemption or a
  slow-host move, a new Serve replica): with the cache on the bucket it loads what the first
  process wrote instead of compiling again.
- **threshold** (``jax_persistent_cache_min_compile_time_secs``, JAX's default 1 s): programs
  that compiled faster are not written; on GKE a cache read is a GCS round trip, so the many
  small programs (array creation, casts) stay out and only the init and the train or decode
  step are kept.
- **writer**: JAX writes entries from process 0 only (the others would race on GCS for the
  same keys); every process reads. A local folder on a multi-host slice is therefore seen by
  host 0 alone, and a new pod starts with an empty disk: on GKE the cache belongs on the
  stack's bucket, ``gs://BUCKET/jax-compilation-cache`` (:func:`raytpu.entrypoints.compilation_cache_uri`).
- **errors**: a cache that cannot be read or written (a missing bucket, no permission) is a
  warning per compilation in JAX and the program compiles as without the cache; only a path
  that can never work (a bad bucket name, another scheme) is refused here, before JAX starts.

Workers and replicas call :func:`from_env` (``RAYTPU_COMPILATION_CACHE_DIR``, :data:`raytpu.entrypoints.COMPILATION_CACHE_ENV`)
before their first ``jit`` call. This module imports jax only inside :func:`enable`: drivers
import it without jax.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from raytpu.entrypoints import COMPILATION_CACHE_ENV
from raytpu.errors import invalid
from raytpu.gcs_names import check_gs_path
from workloads.storage import is_remote, quiet_clients

FIELD = "compilation_cache_dir"
"""The name :func:`enable` gives a bad directory in its error."""
MIN_COMPILE_TIME_S = 1.0
"""JAX's default threshold (``jax_persistent_cache_min_compile_time_secs``): programs compiled
faster are not written. :func:`enable` keeps JAX's setting unless told otherwise."""
VALID = "'' (no cache), a local directory, or gs://BUCKET/PATH (the stack's bucket on GKE)"

logger = logging.getLogger(__name__)


def normalize(cache_dir: str, field: str = FIELD) -> str:
    """``cache_dir`` as JAX will get it (a local one absolute, so every working directory means
    the same folder), or ``ValueError`` naming ``field`` when it can never hold a cache."""
    if not isinstance(cache_dir, str):
        raise ValueError(invalid(field, cache_dir, VALID))
    cache_dir = cache_dir.strip()
    if not cache_dir:
        return ""
    if is_remote(cache_dir):
        check_gs_path(field, cache_dir)
        return cache_dir.rstrip("/")
    if "://" in cache_dir:
        scheme = cache_dir.split("://", 1)[0]
        raise ValueError(
            invalid(
                field, cache_dir, VALID, reason=f"{scheme}:// is not a scheme the cache takes here"
            )
        )
    return str(Path(cache_dir).expanduser().absolute())


def enable(cache_dir: str, *, min_compile_time_s: float | None = None, field: str = FIELD) -> str:
    """Turn JAX's persistent compilation cache on in this process at ``cache_dir`` (``""``:
    nothing changes). Call before the first ``jit``; a later call with another directory
    moves the cache there (JAX otherwise keeps the directory it first opened).
    ``min_compile_time_s``: the threshold; ``None`` keeps JAX's (1 s, or
    ``$JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``). Returns the directory as given to JAX."""
    cache_dir = normalize(cache_dir, field)
    if not cache_dir:
        return ""
    if min_compile_time_s is not None and not min_compile_time_s >= 0:
        raise ValueError(invalid("min_compile_time_s", min_compile_time_s, "seconds >= 0"))
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    if is_remote(cache_dir):
        quiet_clients()
    if jax.config.jax_compilation_cache_dir != cache_dir:
        # JAX opens the cache once per process; forget the one it may have opened.
        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    if min_compile_time_s is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    threshold = jax.config.jax_persistent_cache_min_compile_time_secs
    logger.info("JAX compilation cache: %s (programs compiled in >= %s s)", cache_dir, threshold)
    return cache_dir


def from_env(environ: Mapping[str, str] | None = None) -> str:
    """:func:`enable` at ``$RAYTPU_COMPILATION_CACHE_DIR`` (a bad value's error names the
    variable); unset or empty: no cache. Returns the directory enabled, or ``""``."""
    environ = os.environ if environ is None else environ
    return enable(environ.get(COMPILATION_CACHE_ENV, ""), field=COMPILATION_CACHE_ENV)
