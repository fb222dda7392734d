"""``raytpu notebook --stack dev`` end to end, with what a live cluster would give replaced by
stand-ins that behave the same: a real Ray head (``ray start --head``, token auth on, its Ray
Client server) plays the RayCluster's head; a stand-in ``kubectl`` really forwards the local port
to that head's client port (``kubectl port-forward`` does the same to the head Service); a
stand-in ``gcloud`` prints the head's token (``gcloud auth print-access-token``: your own Google
identity is the credential of a Kubernetes-token RayCluster).

A kernel of the JupyterLab it starts, driven over Jupyter's own kernel protocol (REST and
WebSocket, with the Jupyter token), runs a Ray task on the head through the tunnel."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_delivery_submit import outputs_file  # noqa: F401  (the saved dev-stack outputs)

from infra.manifests import kuberay
from workloads.sim.local_cluster import free_port
from workloads.sim.local_processes import kill_processes_with_env

pytestmark = [pytest.mark.ray, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[1]
HEAD_START_TIMEOUT_S = 180.0  # CI: a head start took over 60 s under load
CELL_TIMEOUT_S = 200.0

FORWARDER = """#!{python}
# kubectl port-forward svc/HEAD LOCAL:10001 -n NS --address 127.0.0.1, forwarding to {target}
import asyncio, sys
open({record!r}, "w").write(" ".join(sys.argv[1:]))
local = int(sys.argv[3].split(":")[0])

async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()

async def handle(reader, writer):
    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", {target})
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", local)
    print(f"Forwarding from 127.0.0.1:{{local}} -> 10001", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""
GCLOUD = """#!/bin/sh
[ "$*" = "auth print-access-token" ] && echo {token} && exit 0
echo "unexpected: $*" >&2; exit 1
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def head(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A real Ray head with token auth and its Ray Client server: (client port, token). Its
    processes are found by their TMPDIR and killed at the end (never ``ray stop``: that would
    stop every Ray on the machine)."""
    token, client_port = secrets.token_hex(32), free_port()
    # The head's TMPDIR and Ray temp folder in one short folder (AF_UNIX paths: at most 107
    # bytes). Under xdist, tmp_path is longer (.../popen-gw1/test_the_stack_notebook_runs_a0/...):
    # the dashboard's forkserver socket in TMPDIR failed to bind ("AF_UNIX path too long"),
    # `ray start` waited a minute for the dashboard before it started the raylet, the Ray Client
    # server gave up waiting for its node after 30 s, and the cell failed "ray client connection
    # timeout".
    short = Path(tempfile.mkdtemp(prefix="raytpu-nb-"))
    tmp, ray_temp = short / "t", short / "r"
    tmp.mkdir()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": token,
        "TMPDIR": str(tmp),
        "RAY_USAGE_STATS_ENABLED": "0",
        **kuberay.HEAD_ENV,  # what the stack's heads set (Ray issue #63202, see there)
    }
    ray = str(Path(sys.executable).with_name("ray"))
    argv = [
        ray, "start", "--head", "--block", "--port", str(free_port()),
        "--ray-client-server-port", str(client_port), "--dashboard-port", str(free_port()),
        "--num-cpus", "2", "--temp-dir", str(ray_temp),
    ]  # fmt: skip
    log = (tmp_path / "head.log").open("wb")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HEAD_START_TIMEOUT_S
        while b"Ray runtime started" not in (tmp_path / "head.log").read_bytes():
            assert process.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the Ray head did not start"
            time.sleep(0.5)
        yield client_port, token
    finally:
        kill_processes_with_env("TMPDIR", str(tmp))
        process.kill()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(short, ignore_errors=True)


def _alive(program: Path) -> bool:
    """Whether a process runs ``program`` (the stand-in kubectl) still."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(program).encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


async def _run_cell(base: str, token: str, code: str) -> str:
    """Start a kernel, run ``code``, return its stdout (Jupyter's messaging protocol, v5)."""
    import websockets

    auth = {"Authorization": f"token {token}"}
    request = urllib.request.Request(f"{base}/api/kernels", data=b"{}", headers=auth)
    with urllib.request.urlopen(request, timeout=30) as reply:
        kernel = json.load(reply)["id"]
    url = f"{base.replace('http', 'ws', 1)}/api/kernels/{kernel}/channels"
    msg_id = uuid.uuid4().hex
    message = {
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell",
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
    }  # fmt: skip
    out: list[str] = []
    async with websockets.connect(url, additional_headers=auth, max_size=None) as ws:
        await ws.send(json.dumps(message))
        while True:
            reply = json.loads(await ws.recv())
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = reply["msg_type"], reply["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                out.append(f"ERROR {content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)


CELL = """
import os, ray
print("address", os.environ["RAY_ADDRESS"])
ray.init()
@ray.remote
def answer():
    return 41 + 1
print("answer", ray.get(answer.remote(), timeout=60))
ray.shutdown()
"""


def test_the_stack_notebook_runs_a_cell_on_the_head_through_the_tunnel(
    tmp_path: Path,
    head: tuple[int, str],
    outputs_file: Path,  # noqa: F811
) -> None:
    client_port, token = head
    saved = json.loads(outputs_file.read_text())
    saved["rayClusters"]["train"]["auth"] = "kubernetes"  # what the dev stack declares
    outputs = tmp_path / "outputs.json"
    outputs.write_text(json.dumps(saved))
    record = tmp_path / "kubectl.record"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = _script(
        bin_dir / "kubectl",
        FORWARDER.format(python=sys.executable, record=str(record), target=client_port),
    )
    _script(bin_dir / "gcloud", GCLOUD.format(token=token))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    # Ray Client's first connect waits 5 s, then 10 and 15 (three tries): under CI's load the
    # head's per-client server took longer to start, and the cell failed "connection timeout".
    env["RAY_CLIENT_INITIAL_CONNECTION_TIMEOUT_S"] = "60"
    argv = [
        sys.executable, "-m", "raytpu_cli", "notebook", "--stack", "dev",
        "--outputs", str(outputs), "--kubectl", str(kubectl), "--duration", "150",
        "--root-dir", str(tmp_path),
    ]  # fmt: skip
    notebook = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert notebook.stdout is not None
        line = notebook.stdout.readline()
        found = re.search(r"JupyterLab attached to (.+): (http://\S+)/lab\?token=(\w+)", line)
        assert found, line + notebook.stdout.read()[-3000:]
        assert found[1] == "RayCluster 'train' (auth: kubernetes)"
        out = asyncio.run(
            asyncio.wait_for(_run_cell(found[2], found[3], CELL), timeout=CELL_TIMEOUT_S)
        )
        local = record.read_text().split()[2].split(":")[0]
        assert f"address ray://127.0.0.1:{local}" in out, out
        assert "answer 42" in out, out
        assert record.read_text() == (
            f"port-forward svc/train-head-svc {local}:10001 -n ray --address 127.0.0.1"
        )
    finally:
        notebook.send_signal(signal.SIGINT)  # Ctrl-C: the lab and the tunnel are stopped
        code = notebook.wait(timeout=60)
        assert code == 130, notebook.stdout.read() if notebook.stdout else code
    assert not _alive(kubectl)
