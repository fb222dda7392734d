"""``raytpu quota`` and ``raytpu submit --queue/--priority`` on the three-team stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from raytpu import crds, kueue
from raytpu_cli.main import main
from tests.hostile import write_project

TEAMS_STACK = Path(__file__).parent / "data" / "Pulumi.teams.yaml"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_project(tmp_path, TEAMS_STACK.read_text(), stack="teams")
    return tmp_path


# team, flavor: slices, chips, borrowing limit, lending limit, pools hold, unassigned
QUOTAS = {
    ("research", "v6e-4x4-4t"): (2, 32, None, 1, 4, 0),
    ("research", "v5p-2x2x4-4t"): (2, 32, None, None, 2, 0),
    ("serving", "v6e-2x4-8t-spot"): (2, 16, None, None, 2, 0),
    ("serving", "v6e-4x4-4t"): (1, 16, 1, None, 4, 0),
    ("batch", "v6e-4x4-4t"): (1, 16, 2, None, 4, 0),
}


def test_quota_json_per_team_and_shape(project: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["quota", "--stack", "teams", "--cwd", str(project), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    found = {
        (r["team"], r["flavor"]): (
            r["slices"],
            r["chips"],
            r["borrowing_limit"],
            r["lending_limit"],
            r["capacity"],
            r["unassigned"],
        )
        for r in rows
    }
    assert found == QUOTAS


def test_quota_table(project: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["quota", "--stack", "teams", "--cwd", str(project)]) == 0
    out = capsys.readouterr().out
    header, _, *lines = out.splitlines()
    assert header.split()[:4] == ["team", "shape", "flavor", "slices"]
    assert lines[0].split()[:2] == ["research", "v6e"] and "v6e-4x4-4t" in lines[0]


def test_quota_oversubscribed_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw = yaml.safe_load(TEAMS_STACK.read_text())
    raw["config"]["ray-tpu:teams"][2]["quotas"][0]["slices"] = 2
    write_project(tmp_path, yaml.safe_dump(raw), stack="teams")
    assert main(["quota", "--stack", "teams", "--cwd", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "-1" in captured.out.splitlines()[2].split()
    assert "flavor v6e-4x4-4t: the teams' nominal quotas exceed" in captured.err


def test_quota_without_teams(capsys: pytest.CaptureFixture) -> None:
    assert main(["quota", "--stack", "dev"]) == 0
    assert "no ray-tpu:teams" in capsys.readouterr().out


def test_quota_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    text = TEAMS_STACK.read_text().replace("priority: low\n", "priority: urgent\n")
    write_project(tmp_path, text, stack="teams")
    assert main(["quota", "--stack", "teams", "--cwd", str(tmp_path)]) == 2
    assert "ray-tpu:teams[2].priority: 'urgent' is not valid" in capsys.readouterr().err


SUBMITS = {
    "team-default-priority": (["--queue", "batch", "train", "--steps", "5"], "batch", "low"),
    "explicit-priority": (
        ["--queue", "research", "--priority", "high", "train"],
        "research",
        "high",
    ),
    "command": (
        ["--queue", "serving", "--slice", "serve", "--", "python", "-V"],
        "serving",
        "high",
    ),
}


@pytest.mark.parametrize(("argv", "queue", "priority"), SUBMITS.values(), ids=SUBMITS)
def test_submit_queue_writes_a_queued_rayjob(
    project: Path, capsys: pytest.CaptureFixture, argv: list[str], queue: str, priority: str
) -> None:
    assert main(["submit", "--stack", "teams", "--cwd", str(project), *argv]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    assert manifest["kind"] == "RayJob"
    labels = manifest["metadata"]["labels"]
    assert (labels[kueue.QUEUE_LABEL], labels[kueue.PRIORITY_LABEL]) == (queue, priority)
    assert manifest["metadata"]["namespace"] == queue
    assert manifest["spec"]["shutdownAfterJobFinishes"] is True


@pytest.mark.crds("kuberay")
@pytest.mark.parametrize("argv", [a for a, _, _ in SUBMITS.values()], ids=SUBMITS)
def test_submit_queue_rayjob_passes_the_kuberay_crd(
    project: Path, capsys: pytest.CaptureFixture, argv: list[str]
) -> None:
    assert main(["submit", "--stack", "teams", "--cwd", str(project), *argv]) == 0
    assert crds.validate_object(yaml.safe_load(capsys.readouterr().out)) == []


BAD_SUBMITS = {
    "unknown-queue": (
        ["--queue", "nobody", "train"],
        "--queue: 'nobody' is not valid; valid: research, serving, batch",
    ),
    "unknown-priority": (
        ["--queue", "batch", "--priority", "urgent", "train"],
        "--priority: 'urgent' is not valid; valid: low, normal, high",
    ),
    "priority-without-queue": (["--priority", "high", "train"], "--priority: needs --queue"),
    "slice-without-quota": (
        ["--queue", "batch", "--slice", "research", "train"],
        "team batch has no quota of flavor v5p-2x2x4-4t",
    ),
    "serve": (["--queue", "serving", "serve"], "'serve' is not valid (--queue is given)"),
}


@pytest.mark.parametrize(("argv", "message"), BAD_SUBMITS.values(), ids=BAD_SUBMITS)
def test_submit_queue_refuses_bad_input(
    project: Path, capsys: pytest.CaptureFixture, argv: list[str], message: str
) -> None:
    assert main(["submit", "--stack", "teams", "--cwd", str(project), *argv]) == 2
    assert message in capsys.readouterr().err
