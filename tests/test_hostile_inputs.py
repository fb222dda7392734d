"""Hostile but fair input, case by case (issue 10): every file the CLI reads, the project it
resolves, the top-level guard and the early flag checks. Each case: exit code and message."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from hostile import ALIAS_BOMB, run_cli, write_project

from raytpu import inputs
from raytpu.stack_outputs import StackOutputsError, read_outputs_file

REPO = Path(__file__).resolve().parents[1]
DEV = (REPO / "Pulumi.dev.yaml").read_text()
RAY = {"apiVersion": "ray.io/v1", "metadata": {"name": "x"}, "spec": {}}

# ------------------------------------------------------------------------------ raytpu check
# (id, file name, content: str | bytes | None for /dev/zero, exit code, message fragment)
CHECK_CASES = [
    (
        "export-resources-is-a-mapping",
        "state.json",
        json.dumps({"deployment": {"resources": {"a": {"type": "x"}}}}),
        2,
        "deployment.resources: a mapping is not valid; valid: a list of resource states",
    ),
    (
        "preview-steps-is-a-string",
        "preview.json",
        json.dumps({"steps": "oops"}),
        2,
        "steps: 'oops' is not valid; valid: a list of steps",
    ),
    (
        "kuberay-kind-typo",
        "k8s.yaml",
        yaml.safe_dump({**RAY, "kind": "RayClustr"}),
        2,
        "kind: 'RayClustr' is not valid; valid: a KubeRay kind: RayCluster, RayService, RayJob "
        "(did you mean RayCluster?)",
    ),
    (
        "unknown-kind-in-the-ray-io-group",
        "k8s.yaml",
        yaml.safe_dump({**RAY, "kind": "RayThing"}),
        2,
        "kind: 'RayThing' is not valid; valid: a KubeRay kind",
    ),
    (
        "kind-is-a-number",
        "k8s.yaml",
        yaml.safe_dump({**RAY, "kind": 5}),
        2,
        "document 1: kind: 5 is not valid; valid: a Kubernetes kind",
    ),
    (
        "other-kind-not-checked",
        "k8s.yaml",
        yaml.safe_dump(
            {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        ),
        0,
        "not checked (no policy reads kubernetes:example.com/v1:Widget): w",
    ),
    (
        "core-kind-schema-checked",
        "k8s.yaml",
        yaml.safe_dump(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "date": {}}
        ),
        1,
        "ConfigMap/cm: (object): Additional properties are not allowed ('date' was unexpected)",
    ),
    (
        "metadata-is-a-string",
        "k8s.yaml",
        yaml.safe_dump({**RAY, "kind": "RayCluster", "metadata": "oops"}),
        2,
        "metadata: 'oops' is not valid; valid: a mapping",
    ),
    (
        "list-items-is-a-number",
        "k8s.yaml",
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": 5}),
        2,
        "document 1: items: 5 is not valid; valid: a list of Kubernetes objects",
    ),
    (
        "deployment-is-a-string",
        "state.json",
        json.dumps({"deployment": "x"}),
        2,
        "deployment: 'x' is not valid; valid: a mapping with resources",
    ),
    (
        "json-nested-100000-deep",
        "deep.json",
        "[" * 100_000 + "]" * 100_000,
        2,
        "line 1, column 101: nested deeper than 100 levels",
    ),
    ("yaml-alias-bomb", "bomb.yaml", ALIAS_BOMB, 2, "(an alias bomb?)"),
    ("dev-zero", None, None, 2, "/dev/zero: larger than 16 MiB"),
    (
        "utf-16",
        "k8s.yaml",
        yaml.safe_dump({**RAY, "kind": "RayCluster"}).encode("utf-16"),
        2,
        "is UTF-16 encoded; valid: UTF-8 text",
    ),
    ("latin-1", "k8s.yaml", "kind: caf\xe9\n".encode("latin-1"), 2, "byte 0xe9 is not UTF-8"),
    (
        "yaml-syntax-error",
        "k8s.yaml",
        "kind: RayCluster\nspec: [1, 2\nmetadata: {}\n",
        2,
        "line 3, column 9: not valid YAML",
    ),
    (
        "control-character",
        "k8s.yaml",
        "kind: Ray\x01Cluster\n",
        2,
        "not valid YAML: unacceptable character #x0001",
    ),
    ("json-syntax-error", "x.json", '{"steps": [}', 2, "line 1, column 12: not valid JSON"),
    (
        "recursive-alias",
        "k8s.yaml",
        "a: &a [*a]\n",
        2,
        "a recursive YAML alias",
    ),
    (
        "preview-new-state-is-a-list",
        "preview.json",
        json.dumps({"steps": [{"op": "create", "newState": [1]}]}),
        2,
        "steps[0].newState: a list is not valid; valid: a resource state",
    ),
    (
        "export-inputs-is-a-string",
        "state.json",
        json.dumps({"deployment": {"resources": [{"type": "gcp:x:Y", "inputs": "s"}]}}),
        2,
        "deployment.resources[0].inputs: 's' is not valid; valid: a mapping",
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "code", "message"),
    [c[1:] for c in CHECK_CASES],
    ids=[c[0] for c in CHECK_CASES],
)
def test_check_on_broken_input(tmp_path, name, content, code, message):
    if content is None:
        path = Path("/dev/zero")
    else:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    run = run_cli("check", str(path))
    assert run.code == code, (run.out, run.err)
    assert message in run.out + run.err, (run.out, run.err)
    assert "Traceback" not in run.err
    assert run.seconds < 10


# ------------------------------------------------------------------------------ stack files
def _dev_with(replace: str, by: str) -> str:
    assert replace in DEV
    return DEV.replace(replace, by, 1)


# (id, Pulumi.dev.yaml content, message fragment); every one exits 2 before anything starts.
STACK_CASES = [
    ("yaml-syntax-error", "config:\n  gcp:project: [oops\n", "line 3, column 1: not valid YAML"),
    ("utf-16", DEV.encode("utf-16"), "is UTF-16 encoded; valid: UTF-8 text"),
    ("not-utf-8", DEV.encode("utf-8") + b"\n# \xff\n", "is not UTF-8"),
    ("nested-2000-deep", "config: " + "[" * 2000 + "]" * 2000, "nested deeper than 100"),
    (
        "alias-bomb-in-runtime-env",
        ALIAS_BOMB.replace("\n", "\n  ").replace("a: &a", "x:\n  a: &a", 1) + "\n",
        "(an alias bomb?)",
    ),
    ("top-level-list", "- config\n", "'list' is not valid; valid: a YAML mapping with config:"),
    (
        "full-width-ray-version",
        _dev_with(
            'ray-tpu:rayVersion: "2.60.0"', 'ray-tpu:rayVersion: "\uff12.\uff16\uff10.\uff10"'
        ),
        "ray-tpu:rayVersion: '\uff12.\uff16\uff10.\uff10' is not valid",
    ),
]


@pytest.mark.parametrize(
    "command",
    [
        ("preview", "dev"),
        ("train", "--local"),
        ("serve", "--local"),
        ("demo",),
    ],
    ids=["preview", "train", "serve", "demo"],
)
@pytest.mark.parametrize(
    ("content", "message"), [c[1:] for c in STACK_CASES], ids=[c[0] for c in STACK_CASES]
)
def test_unreadable_stack_file_exits_2_naming_it(tmp_path, command, content, message):
    path = write_project(tmp_path / "proj", content)
    run = run_cli(*command, "--cwd", str(tmp_path / "proj"))
    assert run.code == 2, (run.out, run.err)
    assert message in run.err, run.err
    assert "Traceback" not in run.err
    assert f"stack dev: {path}" in run.err  # which file was read, on stderr


def test_stack_file_inputs_checked_before_the_runtime_env_is_walked(tmp_path):
    """The bomb inside a real stack (a ray object's runtimeEnv) is refused while reading."""
    raw = yaml.safe_load(DEV)
    text = yaml.safe_dump(raw, sort_keys=False)
    bomb = "".join("  " + line + "\n" for line in ALIAS_BOMB.splitlines())
    path = write_project(tmp_path, text.replace("config:\n", "config:\n  bomb:\n" + bomb, 1))
    assert "bomb:" in path.read_text()
    run = run_cli("preview", "dev", "--cwd", str(tmp_path))
    assert run.code == 2 and "(an alias bomb?)" in run.err, run.err


# ------------------------------------------------------------------------------ the project
def test_project_is_found_from_a_subfolder_and_named(tmp_path):
    path = write_project(tmp_path / "proj", "config: {}\n")
    sub = tmp_path / "proj" / "a" / "b"
    sub.mkdir(parents=True)
    run = run_cli("preview", "dev", "--cwd", str(sub))
    assert run.code == 2  # an empty config: every required key is named
    assert f"stack dev: {path}" in run.err
    assert "gcp:project: is required" in run.err


def test_current_directory_is_the_default(tmp_path, monkeypatch):
    path = write_project(tmp_path, "config: {}\n")
    monkeypatch.chdir(tmp_path)
    run = run_cli("preview", "dev")
    assert run.code == 2 and f"stack dev: {path}" in run.err, run.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("preview", "dev"), "no Pulumi.yaml in"),
        (("train", "--local"), "no Pulumi.yaml in"),
        (("preview", "dev", "--cwd", "/nonexistent/x"), "--cwd: '/nonexistent/x' is not a dir"),
        (("preview", "../../etc/passwd", "--cwd", str(REPO)), "valid: dev, prod"),
        (("preview", "staging", "--cwd", str(REPO)), "stack: 'staging' is not valid; valid: dev"),
    ],
    ids=["no-project", "no-project-train", "cwd-missing", "stack-name-a-path", "unknown-stack"],
)
def test_project_errors_exit_2(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)  # no Pulumi.yaml above a pytest tmp folder
    run = run_cli(*argv)
    assert run.code == 2, (run.out, run.err)
    assert message in run.err, run.err


# ------------------------------------------------------------------------------ guard
@pytest.mark.parametrize(
    ("raised", "code", "first_words"),
    [
        (RuntimeError("boom\nsecond line"), 3, "internal error: RuntimeError: boom; please report"),
        (RecursionError("deep"), 3, "internal error: RecursionError: deep; please report"),
        (KeyboardInterrupt(), 130, "interrupted"),
    ],
    ids=["bug", "recursion", "ctrl-c"],
)
def test_top_level_guard(tmp_path, monkeypatch, raised, code, first_words):
    from raytpu_cli import catalog

    def explode(args):
        raise raised

    monkeypatch.setattr(catalog, "run", explode)
    monkeypatch.setenv("RAYTPU_LOG_DIR", str(tmp_path / "logs"))
    run = run_cli("catalog")
    assert run.code == code
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(first_words), run.err
    if code == 3:
        log = Path(lines[0].rsplit("traceback in ", 1)[1])
        assert log.parent == tmp_path / "logs"
        assert "Traceback" in log.read_text() and "raytpu catalog" in log.read_text()


# ------------------------------------------------------------------------------ early flags
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("train", "--reserve-timeout", "0"), "--reserve-timeout: 0.0 is not valid; valid: a"),
        (("train", "--reserve-timeout", "nan"), "--reserve-timeout: nan is not valid"),
        (("train", "--start-timeout", "-1"), "--start-timeout: -1.0 is not valid"),
        (("train", "--checkpoint-dir", "/proc/no/ck"), "--checkpoint-dir: '/proc/no/ck' is not"),
        (("train", "--checkpoint-dir", "{tmp}/file/ck"), "{tmp}/file/ck' is not valid (Not a"),
        (("serve", "--checkpoint-dir", "{tmp}/no"), "'{tmp}/no' does not exist; valid: a folder"),
        (("serve", "--checkpoint-dir", "{tmp}/empty"), "'{tmp}/empty' holds no checkpoint"),
        (("serve", "--deploy-timeout", "0"), "--deploy-timeout: 0.0 is not valid"),
    ],
    ids=[
        "reserve-timeout-0",
        "reserve-timeout-nan",
        "start-timeout-negative",
        "checkpoint-dir-unwritable",
        "checkpoint-dir-under-a-file",
        "serve-checkpoint-missing",
        "serve-checkpoint-empty",
        "deploy-timeout-0",
    ],
)
def test_bad_flags_exit_2_before_anything_starts(tmp_path, argv, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    run = run_cli(*(a.format(tmp=tmp_path) for a in argv), "--local", "--cwd", str(REPO))
    assert run.code == 2, (run.out, run.err)
    assert message.format(tmp=tmp_path) in run.err, run.err
    assert "cluster" not in run.out  # nothing was started


# ------------------------------------------------------------------------------ outputs
@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 100_000, "nested deeper than 100 levels"),
        (json.dumps({"clusterName": "x"}).encode("utf-16"), "is UTF-16 encoded"),
        ('{"a": }', "line 1, column 7: not valid JSON"),
    ],
    ids=["deep", "utf-16", "syntax"],
)
def test_outputs_file_read_through_the_input_layer(tmp_path, content, message):
    path = tmp_path / "outputs.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(StackOutputsError, match="--outputs: ") as caught:
        read_outputs_file(path, "dev")
    assert message in str(caught.value)


def test_input_limits_are_configurable(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("a: [1, [2, [3]]]\n")
    with pytest.raises(inputs.InputError, match="nested deeper than 2 levels"):
        inputs.load_yaml(path, inputs.Limits(max_depth=2))
    with pytest.raises(inputs.InputError, match="larger than 4 bytes"):
        inputs.load_yaml(path, inputs.Limits(max_bytes=4))
    path.write_text("a: &x 1\nb: [*x, *x]\n")
    with pytest.raises(inputs.InputError, match="more than 1 YAML aliases"):
        inputs.load_yaml(path, inputs.Limits(max_aliases=1))
    assert inputs.load_yaml(path) == {"a": 1, "b": [1, 1]}
    assert os.path.exists(path)
