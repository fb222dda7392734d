"""``raytpu dashboard``: the tunnel command, the printed URL, a bound on start-up, and the tunnel
process always stopped (a stand-in ``kubectl`` records its arguments and its pid)."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest
from test_delivery_submit import outputs_file  # noqa: F401  (the saved dev-stack outputs)

from raytpu_cli import dashboard
from raytpu_cli import main as cli

FAKE = """#!{python}
import os, sys, time
open({record!r}, "w").write(str(os.getpid()) + "\\n" + " ".join(sys.argv[1:]))
mode = {mode!r}
if mode == "fail":
    print("error: services \\"x\\" not found", flush=True)
    sys.exit(1)
if mode == "ok":
    print("Forwarding from 127.0.0.1:" + sys.argv[3].split(":")[0] + " -> 8265", flush=True)
time.sleep(60)
"""


def _fake_kubectl(tmp_path: Path, mode: str) -> tuple[Path, Path]:
    record = tmp_path / "kubectl.record"
    script = tmp_path / "kubectl"
    script.write_text(FAKE.format(python=sys.executable, record=str(record), mode=mode))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, record


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as handle:  # a zombie until reaped counts as gone
        return handle.read().split()[2] == "Z"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("mode", "code", "fragment"),
    [
        ("ok", 0, "Ray Dashboard of RayCluster 'train': http://127.0.0.1:18265"),
        ("fail", 1, 'kubectl port-forward exited: error: services "x" not found'),
        ("silent", 6, "[RTPU-N01 network_timeout]: kubectl port-forward did not forward"),
    ],
    ids=["opens-and-closes", "kubectl-fails", "never-forwards"],
)
def test_dashboard_tunnel(
    tmp_path: Path,
    outputs_file: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    code: int,
    fragment: str,
) -> None:
    monkeypatch.setattr(dashboard, "START_TIMEOUT_S", 3.0)
    script, record = _fake_kubectl(tmp_path, mode)
    began = time.monotonic()
    argv = ["dashboard", "--stack", "dev", "--outputs", str(outputs_file), "--port", "18265"]
    result = cli.main([*argv, "--duration", "1", "--kubectl", str(script)])
    out = capsys.readouterr()
    assert result == code, out
    assert fragment in out.out + out.err
    assert time.monotonic() - began < 20
    pid, args = record.read_text().splitlines()
    assert args == "port-forward svc/train-head-svc 18265:8265 -n ray --address 127.0.0.1"
    assert _gone(int(pid))


def test_unknown_cluster_names_the_valid_ones(
    outputs_file: Path,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        ["dashboard", "--stack", "dev", "--outputs", str(outputs_file), "--cluster", "x"]
    )
    assert code == 2
    assert "--cluster: 'x' is not valid; valid:" in capsys.readouterr().err
