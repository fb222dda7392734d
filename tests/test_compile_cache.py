"""JAX's persistent compilation cache (:mod:`workloads.model.compile_cache`): a second fresh process
loads what the first one wrote, on a local folder and on ``gs://`` (the GCS emulator); paths
that can never hold a cache are refused with the field named.

A cache hit is JAX's own monitoring event ``/jax/compilation_cache/cache_hits`` (recorded where
``jax._src.compiler`` returns an executable read from the cache); JAX records
``/jax/compilation_cache/cache_misses`` as it writes an entry. Each process is a fresh
interpreter with this session's own cache variables removed (``tests/conftest.py`` sets
``JAX_COMPILATION_CACHE_DIR`` for the whole session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from gcs_fixture import gcs_or_skip

from raytpu.entrypoints import (
    COMPILATION_CACHE_ENV,
    COMPILATION_CACHE_FOLDER,
    compilation_cache_uri,
)
from workloads.model import compile_cache

REPO = Path(__file__).resolve().parents[1]
BUCKET = "raytpu-test-cache"
HITS = "/jax/compilation_cache/cache_hits"
WRITES = "/jax/compilation_cache/cache_misses"

# One process: enable the cache at each directory in turn and compile one program there (a new
# shape per directory, so the in-memory jit cache cannot answer); print JAX's cache events.
CHILD = """
import json, sys
import jax, jax.numpy as jnp
from workloads.model import compile_cache
counts = {}
jax.monitoring.register_event_listener(
    lambda event, **_: counts.__setitem__(event, counts.get(event, 0) + 1))
seen = []
for size, directory in enumerate(sys.argv[1:], start=3):
    before = dict(counts)
    compile_cache.enable(directory, min_compile_time_s=0)
    jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((size, size))).block_until_ready()
    seen.append({k: n - before.get(k, 0) for k, n in counts.items()})
print(json.dumps(seen))
"""


def fresh_process(*directories: str) -> list[dict[str, int]]:
    """:data:`CHILD` in a new interpreter; per directory, its hits and writes."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))
    }
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *directories],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    return [{"hits": r.get(HITS, 0), "writes": r.get(WRITES, 0)} for r in seen]


@pytest.fixture(params=["local", "gs"])
def cache(request, tmp_path) -> Iterator[tuple[str, Callable[[], int]]]:
    """``(directory, entries)``: an empty cache directory and a count of the entries in it."""
    if request.param == "local":
        yield str(tmp_path / "jax-cache"), lambda: len(list((tmp_path / "jax-cache").glob("*")))
        return
    with gcs_or_skip(BUCKET) as gcs:
        yield (
            compilation_cache_uri(BUCKET),
            lambda: len(gcs.objects(BUCKET, COMPILATION_CACHE_FOLDER + "/")),
        )


def test_a_restart_loads_what_the_first_process_wrote(cache):
    directory, entries = cache
    [first] = fresh_process(directory)
    assert first["hits"] == 0 and first["writes"] >= 1
    written = entries()
    assert written >= first["writes"]
    [restart] = fresh_process(directory)
    assert restart == {"hits": first["writes"], "writes": 0}
    assert entries() == written


def test_a_second_directory_in_one_process_gets_its_own_entries(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    seen = fresh_process(str(first), str(second))
    assert [s["writes"] >= 1 for s in seen] == [True, True]
    assert list(first.iterdir()) and list(second.iterdir())


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("", ""),
        ("  ", ""),
        ("gs://raytpu-ckpt/jax-compilation-cache/", "gs://raytpu-ckpt/jax-compilation-cache"),
        ("gs://raytpu-ckpt", "gs://raytpu-ckpt"),
        ("relative/cache", str(Path("relative/cache").absolute())),
        ("~/cache", str(Path.home() / "cache")),
    ],
    ids=["empty", "blank", "gs-trailing-slash", "gs-bucket-root", "relative", "home"],
)
def test_normalize(given, expected):
    assert compile_cache.normalize(given) == expected


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("gs://Raytpu_Ckpt/cache", "bucket 'Raytpu_Ckpt' is not a GCS bucket name"),
        ("gs://", "bucket '' is not a GCS bucket name"),
        ("gs://my-google-bucket/c", "bucket 'my-google-bucket' is not a GCS bucket name"),
        ("s3://bucket/cache", "s3:// is not a scheme the cache takes here"),
    ],
    ids=["uppercase-bucket", "no-bucket", "goog-in-name", "other-scheme"],
)
@pytest.mark.parametrize("field", [compile_cache.FIELD, COMPILATION_CACHE_ENV])
def test_bad_directory_names_the_field(given, reason, field):
    with pytest.raises(ValueError) as error:
        if field == COMPILATION_CACHE_ENV:
            compile_cache.from_env({COMPILATION_CACHE_ENV: given})
        else:
            compile_cache.enable(given)
    message = str(error.value)
    assert message.startswith(f"{field}: {given!r} is not valid ({reason}); valid: ")


def test_bad_threshold_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"^min_compile_time_s: -1 is not valid; valid: seconds"):
        compile_cache.enable(str(tmp_path), min_compile_time_s=-1)


def test_unset_env_is_no_cache_and_imports_no_jax():
    code = (
        "import sys; from workloads.model import compile_cache as c; "
        "print(repr(c.from_env({})), repr(c.from_env({c.COMPILATION_CACHE_ENV: ''})), 'jax' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["''", "''", "False"]
