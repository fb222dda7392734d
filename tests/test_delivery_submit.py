"""``raytpu submit`` for real: a local Ray head, the same client code, the project's own code.

The fixture starts ``ray start --head --block`` on free ports in its own process group and a
temp dir (``delivery_ray_nodes``), and ends that group (only it) on exit. ``ray stop`` is never
used: it would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from delivery_ray_nodes import free_ports, local_ray

from raytpu.stack_outputs import parse_outputs
from raytpu_cli import jobs
from raytpu_cli import main as cli

JOB_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A local Ray head with the dashboard (Job Submission API); yields its address."""
    with local_ray() as cluster:
        yield cluster.address


@pytest.fixture
def outputs_file(tmp_path: Path) -> Path:
    """Saved stack outputs shaped like the dev stack's."""
    outputs = {
        "clusterName": "raytpu-dev",
        "clusterEndpoint": "10.0.0.2",
        "kubeconfig": "[secret]",
        "slices": {
            "train": {
                "generation": "v6e",
                "topology": "2x4",
                "machineType": "ct6e-standard-4t",
                "chipsPerHost": 4,
                "hosts": 2,
                "chips": 8,
                "count": 1,
                "nodePools": ["train-0"],
            },
            "serve": {
                "generation": "v6e",
                "topology": "2x2",
                "machineType": "ct6e-standard-4t",
                "count": 1,
                "nodePools": ["serve-0"],
            },
        },
        "rayClusters": {
            "train": {
                "namespace": "ray",
                "slice": "train",
                "headService": "train-head-svc",
                "dashboardPort": 8265,
            }
        },
        "rayServices": {
            "serve": {
                "namespace": "ray",
                "slice": "serve",
                "headService": "serve-head-svc",
                "serveService": "serve-serve-svc",
                "dashboardPort": 8265,
            }
        },
    }
    path = tmp_path / "dev-outputs.json"
    path.write_text(json.dumps(outputs))
    return path


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_submit_runs_project_code_on_a_real_ray_head(
    ray_head: str, outputs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI path end to end: outputs file -> head check -> runtime env -> job -> SUCCEEDED."""
    code = cli.main(
        [
            "submit",
            "--stack",
            "dev",
            "--outputs",
            str(outputs_file),
            "--address",
            ray_head,
            "--timeout",
            str(JOB_TIMEOUT_S),
            "--env",
            "MARK=from-the-cli",
            "--",
            "sh",
            "-c",
            "python -m raytpu_cli catalog v6e 2x4 --machine-type ct6e-standard-4t --json"
            ' && echo "slice=$RAYTPU_SLICE topology=$RAYTPU_TOPOLOGY mark=$MARK"',
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    # The project's code ran from the job's working_dir, sized by the catalog...
    assert '"hosts": 2' in captured.out
    # ...with the runtime env's variables: the stack's slice and the user's --env.
    assert "slice=train topology=2x4 mark=from-the-cli" in captured.out
    assert "SUCCEEDED" in captured.err


@pytest.mark.ray
@pytest.mark.timeout(400)
def test_submit_reports_a_failing_job(ray_head: str, outputs_file: Path) -> None:
    """A job that fails ends FAILED with its logs, through the library API."""
    outputs = parse_outputs(json.loads(outputs_file.read_text()), "dev")
    head = outputs.ray_cluster("train")
    with tempfile.TemporaryDirectory() as tmp:
        working_dir = jobs.stage_working_dir(Path(tmp))
        request = jobs.build_request(
            ["python", "-c", "import raytpu.catalog as c; c.shape('v6e', '4x5')"],
            outputs,
            head,
            working_dir,
        )
        result = jobs.submit(ray_head, head, request, wait=True, timeout_s=JOB_TIMEOUT_S)
    assert result.status == "FAILED"
    assert not result.succeeded
    assert "'4x5' is not valid" in result.logs


@pytest.mark.timeout(60)
def test_unreachable_head_names_the_port_forward_command(
    outputs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (port,) = free_ports(1)
    started = time.monotonic()
    code = cli.main(
        [
            "submit",
            "--stack",
            "dev",
            "--outputs",
            str(outputs_file),
            "--address",
            f"http://127.0.0.1:{port}",
            "train",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert time.monotonic() - started < 30
    assert f"kubectl port-forward svc/train-head-svc {port}:8265 -n ray" in err
