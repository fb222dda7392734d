"""``raytpu train`` and ``raytpu serve`` as a person runs them, each in its own process.

Bad inputs: refused within 10 s with exit 2 and one line (besides the "stack ...:" notice on
which file was read), no traceback, nothing started and nothing left running (every process that
inherited the run's environment marker is gone). Good runs: the console holds the phases and the
summary, no Ray log line; and the docs' OpenAI client example works against ``serve --local``.
"""

from __future__ import annotations

import json
import os
import re
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFUSED_WITHIN_S = 10.0
"""CPU seconds a refusal may cost (about 3 s alone, as wall time on an idle machine)."""
REFUSED_WALL_S = 45.0
"""Its wall-time bound: beside the suite's other worker's Ray clusters the same 3 s of work took
15 s of wall time here; that is load, not the command waiting on anything."""
MARK_ENV = "RAYTPU_TEST_RUN_MARK"
RAY_LOG_LINE = re.compile(
    r"\([\w:.\-]+ pid=\d+|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\[repeated \d+x|\x1b\[\d+m\(|"
    r"\b(INFO|WARNING|DEBUG)\b"
)
"""What Ray (and JAX through it) prints: ``(ServeController pid=12)`` prefixes of forwarded
worker logs, the driver's timestamped records, the de-duplicator's notes, colour codes."""


@dataclass(frozen=True)
class Finished:
    code: int
    out: str
    err: str
    seconds: float
    left_running: list[str]
    cpu_s: float = 0.0
    """User and system CPU seconds of the command and the children it waited for."""


def _env(gcs_dir: Path, log_dir: Path, mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYTPU_", "RAY_ADDRESS"))}
    return {
        **env,
        MARK_ENV: mark,
        "RAYTPU_LOCAL_GCS_DIR": str(gcs_dir),
        "RAYTPU_LOG_DIR": str(log_dir),
    }


def _marked(mark: str) -> list[str]:
    """The command lines of live processes whose environment carries ``mark``."""
    found = []
    needle = f"{MARK_ENV}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if (entry / "stat").read_text().split(") ", 1)[1].startswith("Z"):
                continue  # a zombie, exited
            found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def _start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "raytpu_cli", *argv, "--local", "--cwd", str(REPO)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(process: subprocess.Popen[str], mark: str, timeout_s: float, began: float) -> Finished:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    seconds = time.monotonic() - began
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    deadline = time.monotonic() + 5  # a child's exit is seen a moment after its parent's
    while (left := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return Finished(process.returncode, out, err, seconds, left, cpu_s)


def _run(argv: list[str], env_dirs: tuple[Path, Path], timeout_s: float) -> Finished:
    mark = uuid.uuid4().hex
    began = time.monotonic()
    process = _start(argv, _env(*env_dirs, mark))
    return _finish(process, mark, timeout_s, began)


def _meta(fs, path: str, meta: dict) -> None:
    fs.pipe_file(path, json.dumps(meta).encode())


@pytest.fixture(scope="module")
def gcs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The emulator's folder with two runs: run-a (the byte LM, steps 20 and 40) and run-b (the
    tiny preset, step 10); written through the emulator, as a training run writes them."""
    import gcsfs.core

    from workloads.sim.gcs_emulator import GcsEmulator

    folder = tmp_path_factory.mktemp("gcs")
    with GcsEmulator(("raytpu-local",), data_dir=folder):
        fs = gcsfs.core.GCSFileSystem(token="anon", skip_instance_cache=True)
        for step in (20, 40):
            _meta(fs, f"raytpu-local/run-a/{step}/meta/metadata", {"step": step})
        tiny = {"step": 10, "family": "llama", "model": {"name": "tiny"}}
        _meta(fs, "raytpu-local/run-b/10/meta/metadata", tiny)
    return folder


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


BAD_INPUTS = {
    "gs-holds-no-checkpoint": (
        ["serve", "--checkpoint-dir", "gs://raytpu-local/nope"],
        "--checkpoint-dir: 'gs://raytpu-local/nope' holds no checkpoint; valid: a folder of "
        "checkpoints: gs://raytpu-local/run-a, gs://raytpu-local/run-b",
    ),
    "local-holds-no-checkpoint": (
        ["serve", "--checkpoint-dir", "{tmp}/empty"],
        "--checkpoint-dir: '{tmp}/empty' holds no checkpoint; valid: a folder of checkpoints",
    ),
    "serve-preset-not-the-checkpoint": (
        ["serve", "--checkpoint-dir", "gs://raytpu-local/run-b", "--preset", "1b"],
        "--preset: '1b' is not valid; valid: tiny; gs://raytpu-local/run-b holds a tiny "
        "checkpoint (step 10)",
    ),
    "train-preset-not-the-checkpoint": (
        ["train", "--checkpoint-dir", "gs://raytpu-local/run-a", "--preset", "tiny"],
        "--preset: 'tiny' is not valid; valid: no --preset; gs://raytpu-local/run-a holds a "
        "byte-lm checkpoint (step 40)",
    ),
    "train-resumes-another-model": (
        ["train", "--checkpoint-dir", "gs://raytpu-local/run-b"],
        "--checkpoint-dir: 'gs://raytpu-local/run-b' is not valid (for the byte LM: "
        "gs://raytpu-local/run-b holds a tiny checkpoint (step 10)); valid: --preset tiny",
    ),
    "port-in-use": (
        ["serve", "--checkpoint-dir", "gs://raytpu-local/run-a", "--port", "{port}"],
        "--port: {port} is not valid (Address already in use); valid: a free port, or 0",
    ),
    "serve-slice-not-declared": (
        ["serve", "--slice", "nope"],
        "ray-tpu:slices: 'nope' is not valid; valid: train, serve",
    ),
    "train-slice-not-declared": (
        ["train", "--slice", "nope"],
        "ray-tpu:slices: 'nope' is not valid; valid: train, serve",
    ),
}


@pytest.mark.parametrize(("argv", "message"), BAD_INPUTS.values(), ids=BAD_INPUTS)
def test_bad_input_is_one_line_within_10_s_and_nothing_is_left_running(
    argv, message, gcs_dir, busy_port, tmp_path
):
    (tmp_path / "empty").mkdir()
    given = [a.format(tmp=tmp_path, port=busy_port) for a in argv]
    run = _run(given, (gcs_dir, tmp_path / "logs"), timeout_s=60)
    assert run.code == 2, (run.out, run.err)
    assert run.cpu_s < REFUSED_WITHIN_S and run.seconds < REFUSED_WALL_S, run
    lines = [line for line in run.err.splitlines() if not line.startswith("stack dev: ")]
    assert len(lines) == 1, run.err
    assert lines[0].startswith(f"error: {message.format(tmp=tmp_path, port=busy_port)}"), run.err
    assert "Traceback" not in run.out + run.err
    assert run.out == ""  # not even the log file's line: nothing had started
    assert run.left_running == []
    assert not (tmp_path / "logs").exists()


def test_the_scan_finds_a_process_that_outlived_its_parent(tmp_path):
    """The "nothing left running" check above can fail: a grandchild left behind is found."""
    mark = uuid.uuid4().hex
    orphan = (
        "import subprocess, sys; "
        "print(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"
    )
    started = subprocess.run(
        [sys.executable, "-c", orphan],
        env=_env(tmp_path, tmp_path, mark),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    try:
        assert [line for line in _marked(mark) if "time.sleep(60)" in line], _marked(mark)
    finally:
        os.kill(int(started.stdout), signal.SIGKILL)


JOB_LOG = (
    "2026-12-06 13:01:09,813\tINFO job_manager.py:581 -- Runtime env is setting up.\n"
    "[train] Ray and JAX logs: /dev/null\n"
    "\x1b[36m(RayTrainWorker pid=12, ip=10.0.0.2)\x1b[0m [train] step 3/6 loss 4.1\n"
    "  training \u2501\u2501 6/6 loss 3.0\n"
    "/x/api_core/v.py:254: FutureWarning: You are using a Python version\n"
    "  warnings.warn(message, FutureWarning)\n"
    "checkpoint           gs://b/train @ 6\n"
)


@pytest.mark.parametrize("chunk", [1, 7, len(JOB_LOG)], ids=["by-char", "by-7", "whole"])
@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_a_followed_job_log_shows_its_own_lines_and_files_every_line(tmp_path, chunk, verbose):
    """``raytpu submit``'s follower: the job's own lines on the console, Ray's only in the file,
    whatever the chunks the Job API hands over."""
    from raytpu_cli.console import LogSplitter

    shown: list[str] = []
    splitter = LogSplitter(tmp_path / "job.log", shown.append, verbose=verbose)
    for start in range(0, len(JOB_LOG), chunk):
        splitter(JOB_LOG[start : start + chunk])
    splitter.flush()
    lines = JOB_LOG.splitlines()
    assert (tmp_path / "job.log").read_text().splitlines() == lines
    own = [lines[1], lines[3], lines[6]]
    assert shown == (lines if verbose else own)


# ------------------------------------------------------------------------------ good runs
TRAIN_STEPS = 6
DEMO_LINES_BEFORE_SUMMARY = 5
"""What ``raytpu demo`` prints before its summary for the phases ``train`` and ``serve`` share:
the log file, the stack's slices, the cluster start, then training (its bar and a "trained" line)
or serving (its deploy and its requests)."""


def _phase_lines(out: str) -> tuple[list[str], list[str]]:
    """(lines before the summary table, the table's lines): the table starts at its header."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if re.match(r"^(train|prompt) +\S", line))
    return lines[:header], lines[header:]


@pytest.fixture(scope="module")
def trained(gcs_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Finished:
    logs = tmp_path_factory.mktemp("train-logs")
    argv = ["train", "--steps", str(TRAIN_STEPS), "--checkpoint-every", "3"]
    argv += ["--global-batch", "8", "--checkpoint-dir", "gs://raytpu-local/console"]
    return _run(argv, (gcs_dir, logs), timeout_s=400)


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_train_console_is_phases_and_a_summary(trained: Finished) -> None:
    assert trained.code == 0, trained.out + trained.err[-3000:]
    before, table = _phase_lines(trained.out)
    assert len(before) <= DEMO_LINES_BEFORE_SUMMARY, trained.out
    assert before[0].startswith("[train] Ray and JAX logs: "), trained.out
    assert any("training ━" in line and f"{TRAIN_STEPS}/{TRAIN_STEPS}" in line for line in before)
    assert any(
        row.startswith("checkpoint ") and "gs://raytpu-local/console @ 6" in row for row in table
    )
    for line in trained.out.splitlines() + trained.err.splitlines():
        assert not RAY_LOG_LINE.search(line), line
    assert trained.err.splitlines() == [f"stack dev: {REPO / 'Pulumi.dev.yaml'}"]
    log = Path(before[0].split(": ", 1)[1])
    assert f"[train] step {TRAIN_STEPS}/{TRAIN_STEPS}" in log.read_text(errors="replace")
    assert trained.left_running == []


def _docs_openai_snippet() -> str:
    text = (REPO / "docs" / "workloads" / "serving.md").read_text()
    section = text.split("### OpenAI-compatible API", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def _read_until(process: subprocess.Popen[str], needle: str, timeout_s: float) -> list[str]:
    """stdout lines up to and including the first that holds ``needle``."""
    assert process.stdout is not None
    lines: list[str] = []
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not selector.select(timeout=1.0):
            continue
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if needle in line:
            return lines
    raise AssertionError(f"no {needle!r} within {timeout_s:.0f} s: {lines}")


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_serve_console_is_phases_and_the_docs_openai_client_works(
    trained: Finished, gcs_dir: Path, tmp_path: Path
) -> None:
    assert trained.code == 0, trained.err[-2000:]
    mark = uuid.uuid4().hex
    began = time.monotonic()
    argv = ["serve", "--checkpoint-dir", "gs://raytpu-local/console", "--prompt", "The old"]
    process = _start([*argv, "--duration", "50"], _env(gcs_dir, tmp_path / "logs", mark))
    try:
        seen = _read_until(process, "base_url=", timeout_s=300)
        port = re.search(r"base_url=http://127\.0\.0\.1:(\d+)/generate/v1", seen[-1]).group(1)
        client = subprocess.run(
            [sys.executable, "-c", _docs_openai_snippet().replace("PORT", port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    served = _finish(process, mark, timeout_s=240, began=began)
    assert client.returncode == 0, client.stderr
    assert client.stdout.splitlines()[0] == "['raytpu-byte-lm']", client.stdout
    assert served.code == 0, served.err[-3000:]
    out = "\n".join(seen) + "\n" + served.out
    before, table = _phase_lines(out)
    # the demo's five, and its summary's "serve deploy ... at URL" row: the line with base_url
    assert len(before) <= DEMO_LINES_BEFORE_SUMMARY + 1, out
    assert before[1].startswith("checkpoint gs://raytpu-local/console: byte-lm at step 6"), out
    assert table[2].startswith("The old ") and " 200 " in table[2], out
    assert out.splitlines()[-1] == "serving for 50 s; Ctrl-C stops", out
    for line in out.splitlines() + served.err.splitlines():
        assert not RAY_LOG_LINE.search(line), line
    assert served.err.splitlines() == [f"stack dev: {REPO / 'Pulumi.dev.yaml'}"]
    assert served.left_running == []
