"""Batch inference without Ray: the input's checks, the output files' exactly-once rules, the
job file, the command's refusals, and the batch job as a RayJob of the stack."""

from __future__ import annotations

import copy
import json
import shlex
import threading
import time
from pathlib import Path

import pytest
import yaml
from gcs_fixture import gcs_or_skip

from workloads.batch import files
from workloads.batch.job import BatchConfig, plan_batch
from workloads.batch.predictor import buckets_for, row_seed

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('"hello"', files.Prompt(0, "hello")),
        ('{"prompt": "hi", "max_new_tokens": 4}', files.Prompt(0, "hi", 4)),
        ('{"prompt": "hi", "temperature": 1, "id": 7}', files.Prompt(0, "hi", None, 1.0, "7")),
    ],
    ids=["string", "object-tokens", "object-temperature-id"],
)
def test_a_good_line(line, expected):
    assert files.parse_line("in.jsonl:1", 0, line) == expected


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("{nope", "in.jsonl:3: '{nope' is not valid (Expecting property name"),
        ("[1, 2]", "in.jsonl:3: [1, 2] is not valid; valid: a JSON string or an object"),
        ('{"prompt": ""}', "in.jsonl:3.prompt: '' is not valid; valid: a non-empty string"),
        ('{"prompt": 5}', "in.jsonl:3.prompt: 5 is not valid; valid: a non-empty string"),
        ('{"text": "x"}', "in.jsonl:3.text: 'x' is not valid; valid: prompt, max_new_tokens"),
        (
            '{"prompt": "x", "max_new_tokens": "4"}',
            "in.jsonl:3.max_new_tokens: '4' is not valid; valid: an integer >= 1",
        ),
        (
            '{"prompt": "x", "max_new_tokens": true}',
            "in.jsonl:3.max_new_tokens: True is not valid",
        ),
        ('{"prompt": "x", "temperature": "hot"}', "in.jsonl:3.temperature: 'hot' is not valid"),
        ('{"prompt": "x", "id": [1]}', "in.jsonl:3.id: [1] is not valid"),
        ('"\\ud800"', "in.jsonl:3.prompt: '\\ud800' is not valid; valid: text that encodes"),
        (json.dumps("x" * 20_000), "in.jsonl:3.prompt: '20000 bytes' is not valid"),
    ],
    ids=[
        "not-json",
        "a-list",
        "empty-prompt",
        "number-prompt",
        "unknown-field",
        "tokens-string",
        "tokens-bool",
        "temperature-string",
        "id-list",
        "lone-surrogate",
        "too-long",
    ],
)
def test_a_bad_line_names_the_line_and_field(line, fragment):
    with pytest.raises(ValueError) as refused:
        files.parse_line("in.jsonl:3", 2, line)
    assert fragment in str(refused.value)


def _write_lines(path: Path, prompts: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    return path


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_folder_of_inputs_is_read_in_name_order(tmp_path):
    _write_lines(tmp_path / "in" / "b.jsonl", ["third"])
    (tmp_path / "in" / "a.jsonl").write_text('"first"\n\n{"prompt": "second"}\n')
    (tmp_path / "in" / "notes.txt").write_text("not an input\n")
    prompts = files.read_prompts("input", str(tmp_path / "in"))
    assert [(p.row, p.prompt) for p in prompts] == [(0, "first"), (1, "second"), (2, "third")]


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: d / "missing.jsonl", "(not found); valid: a JSON Lines file"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "(none); valid: a folder holding"),
        (lambda d: _text(d / "blank.jsonl", "\n \n"), "(no lines); valid: at least one"),
        (lambda d: _write_lines(d / "bad.jsonl", ["ok", 3]), "bad.jsonl:2: 3 is not valid"),
    ],
    ids=["missing", "empty-folder", "no-prompt", "second-line-bad"],
)
def test_an_input_refused_before_anything(tmp_path, make, fragment):
    path = make(tmp_path)
    with pytest.raises(ValueError) as refused:
        files.read_prompts("input", str(path))
    assert fragment in str(refused.value)


@pytest.mark.parametrize(
    ("count", "chunk_rows", "sizes"),
    [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (1, 128, [1])],
    ids=["ragged", "even", "one-row"],
)
def test_chunks_cover_every_row_once(count, chunk_rows, sizes):
    found = files.chunks(count, chunk_rows)
    assert [len(c) for c in found] == sizes
    assert [r for c in found for r in c] == list(range(count))


@pytest.mark.parametrize(
    ("name", "chunk"),
    [
        ("part-000012.jsonl", 12),
        ("bucket/out/part-000000.jsonl", 0),
        (".part-000012.jsonl.99.tmp", None),
        ("_job.json", None),
        ("part-x.jsonl", None),
    ],
    ids=["part", "gcs-listing", "temporary", "job-file", "not-a-number"],
)
def test_chunk_of_a_file_name(name, chunk):
    assert files.chunk_of(name) == chunk
    if chunk is not None:
        assert files.part_name(chunk) == name.rsplit("/", 1)[-1]


def _record(row: int) -> dict:
    return {"row": row, "completion": f"c{row}"}


def test_a_redone_chunk_replaces_its_file_and_the_check_sees_every_row_once(tmp_path):
    out = str(tmp_path / "out")
    for chunk, rows in enumerate(files.chunks(5, 2)):
        files.write_atomic(files.part_path(out, chunk), files.encode_lines(map(_record, rows)))
    first = Path(files.part_path(out, 1)).read_bytes()
    files.write_atomic(files.part_path(out, 1), files.encode_lines(map(_record, range(2, 4))))
    assert Path(files.part_path(out, 1)).read_bytes() == first
    Path(files.temporary_name(files.part_path(out, 2), 4242)).write_text('{"row": 4')
    assert files.done_chunks(out) == {0, 1, 2}
    check = files.check_outputs(out, 5)
    assert check.stray == (".part-000002.jsonl.4242.tmp",)
    assert files.remove_temporaries(out) == 1
    check = files.check_outputs(out, 5)
    assert (check.files, check.rows, check.exactly_once, check.stray) == (3, 5, True, ())


@pytest.mark.parametrize(
    ("extra", "missing", "repeated"),
    [
        ({"part-000009.jsonl": [1]}, (), (1,)),
        ({"part-000009.jsonl": [7]}, (), (7,)),
        ({}, (4, 5), ()),
    ],
    ids=["row-twice", "row-out-of-range", "rows-missing"],
)
def test_the_exactly_once_check_can_fail(tmp_path, extra, missing, repeated):
    out = tmp_path / "out"
    files.write_atomic(str(out / "part-000000.jsonl"), files.encode_lines(map(_record, range(4))))
    for name, rows in extra.items():
        files.write_atomic(str(out / name), files.encode_lines(map(_record, rows)))
    rows = 6 if missing else 4
    check = files.check_outputs(str(out), rows)
    assert (check.missing, check.repeated, check.exactly_once) == (missing, repeated, False)


def _config(tmp_path: Path, **changes) -> BatchConfig:
    if not (tmp_path / "in.jsonl").exists():
        _write_lines(tmp_path / "in.jsonl", [f"prompt {i}" for i in range(10)])
    fields = {
        "input": str(tmp_path / "in.jsonl"),
        "output": str(tmp_path / "out"),
        "checkpoint_dir": str(tmp_path / "ck"),
        "chunk_rows": 4,
    }
    return BatchConfig(**{**fields, **changes})


def test_a_rerun_resumes_only_the_same_job(tmp_path):
    plan = plan_batch(_config(tmp_path))
    assert (plan.resumed, plan.pending, plan.pending_rows) == (False, [0, 1, 2], 10)
    files.write_atomic(files.part_path(plan.config.output, 1), b'{"row": 4}\n')
    again = plan_batch(_config(tmp_path))
    assert (again.resumed, again.pending, again.pending_rows) == (True, [0, 2], 6)
    with pytest.raises(ValueError) as refused:
        plan_batch(_config(tmp_path, seed=3))
    assert "output: " in str(refused.value)
    assert "its _job.json has seed=0, this job 3" in str(refused.value)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"chunk_rows": 0}, "chunk_rows: 0 is not valid; valid: an integer 1..100000"),
        ({"batch_size": 1000}, "batch_size: 1000 is not valid; valid: an integer 1..256"),
        ({"max_new_tokens": 0}, "max_new_tokens: 0 is not valid; valid: an integer 1..256"),
        ({"temperature": -1.0}, "temperature: -1.0 is not valid; valid: a number 0..2.0"),
        ({"timeout_s": 0}, "timeout_s: 0 is not valid; valid: seconds > 0"),
        ({"kill_chunk": 3}, "kill_chunk: 3 is not valid; valid: 0..2"),
        ({"output": "/proc/raytpu-out"}, "output: '/proc/raytpu-out' is not valid ("),
    ],
    ids=[
        "chunk-rows",
        "batch-size",
        "max-new-tokens",
        "temperature",
        "timeout",
        "kill-chunk",
        "unwritable-output",
    ],
)
def test_a_bad_config_is_refused_before_the_output_is_touched(tmp_path, changes, fragment):
    with pytest.raises(ValueError) as refused:
        plan_batch(_config(tmp_path, **changes))
    assert fragment in str(refused.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({"prompt": "x", "max_new_tokens": 999}, "row 1.max_new_tokens: 999 is not valid"),
        ({"prompt": "x", "temperature": 9}, "row 1.temperature: 9.0 is not valid"),
    ],
    ids=["tokens-over-the-serving-bound", "temperature-over-the-bound"],
)
def test_a_row_over_the_serving_bounds_is_refused(tmp_path, row, fragment):
    (tmp_path / "in.jsonl").write_text(json.dumps("ok") + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError) as refused:
        plan_batch(_config(tmp_path))
    assert fragment in str(refused.value)


@pytest.mark.parametrize(
    ("devices", "batch_size", "buckets"),
    [(4, 32, (32,)), (4, 30, (32,)), (8, 4, (8,)), (1, 1, (1,))],
    ids=["multiple", "rounded-up", "fewer-rows-than-chips", "one-chip"],
)
def test_one_engine_bucket_a_multiple_of_the_chips(devices, batch_size, buckets):
    assert buckets_for(devices, batch_size) == buckets


def test_row_seeds_are_the_same_on_a_redo_and_differ_between_rows_and_jobs():
    assert row_seed(0, 3) == row_seed(0, 3)
    seeds = {row_seed(s, r) for s in (0, 1) for r in range(500)}
    assert len(seeds) == 1000
    assert all(0 <= s < 2**31 for s in seeds)


# -- the command ---------------------------------------------------------------------------


@pytest.fixture
def prompts_file(tmp_path: Path) -> Path:
    return _write_lines(tmp_path / "in.jsonl", ["one", "two"])


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--chunk-rows", "0"], "--chunk-rows: 0 is not valid; valid: an integer 1..100000"),
        (["--temperature", "5"], "--temperature: 5.0 is not valid; valid: a number 0..2.0"),
        (["--inject", "kill-host@2"], "--inject: 'kill-host@2' is not valid; valid: kill-actor@"),
        (["--timeout", "0"], "--timeout: 0.0 is not valid; valid: a number of seconds > 0"),
        (["--topology", "2x4"], "is not valid (2 processes on 2 TPU hosts"),
        (["--input", "/nowhere.jsonl"], "input: '/nowhere.jsonl' is not valid (not found)"),
    ],
    ids=["chunk-rows", "temperature", "inject", "timeout", "multi-host-local-dir", "no-input"],
)
def test_the_command_refuses_bad_input_with_exit_2(prompts_file, capsys, extra, fragment):
    from raytpu_cli.main import main

    output = prompts_file.parent / "out"
    argv = ["batch", "--generation", "v6e", "--topology", "2x2", "--input", str(prompts_file)]
    argv += ["--output", str(output), "--checkpoint-dir", "/ck", "--machine-type"]
    argv += ["ct6e-standard-4t", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err, err
    assert not output.exists()


# -- the batch job as a RayJob of the stack ------------------------------------------------


def test_a_batch_job_is_a_rayjob_of_the_stack_with_its_team_queue():
    from infra.config.stack import parse_config
    from infra.manifests import ray_kinds
    from raytpu.kueue import PRIORITY_LABEL, QUEUE_LABEL

    raw = yaml.safe_load((REPO / "tests" / "data" / "Pulumi.teams.yaml").read_text())["config"]
    raw = {**copy.deepcopy(raw), "ray-tpu:imageTag": "abc123"}  # no git checkout needed
    command = (
        "python -m raytpu_cli batch --slice train --input gs://b/prompts/ "
        "--output gs://b/out/nightly --checkpoint-dir gs://b/ck"
    )
    raw["ray-tpu:rayJobs"].append(
        {
            "name": "batch-infer",
            "namespace": "batch",
            "slice": "train",
            "replicas": 1,
            "entrypoint": command,
        }
    )
    stack = parse_config(raw)
    (obj,) = [m for m in ray_kinds.manifests(stack) if m["metadata"]["name"].startswith("batch-")]
    assert obj["kind"] == "RayJob"
    assert shlex.split(obj["spec"]["entrypoint"])[2:4] == ["raytpu_cli", "batch"]
    labels = obj["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[PRIORITY_LABEL]) == ("batch", "low")
    workers = obj["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [w["numOfHosts"] for w in workers] == [stack.slice("train").shape.hosts]


def test_the_files_on_gcs_through_the_emulator(tmp_path):
    with gcs_or_skip("batch-bucket"):
        source = "gs://batch-bucket/in/prompts.jsonl"
        fs = files.filesystem(source)
        fs.pipe_file(source, b'"one"\n{"prompt": "two", "id": "b"}\n')
        prompts = files.read_prompts("input", "gs://batch-bucket/in")
        assert [(p.row, p.prompt, p.id) for p in prompts] == [(0, "one", ""), (1, "two", "b")]
        out = "gs://batch-bucket/out"
        plan = plan_batch(BatchConfig(input=source, output=out, checkpoint_dir="gs://x/ck"))
        assert (plan.resumed, plan.pending) == (False, [0])
        files.write_atomic(files.part_path(out, 0), files.encode_lines(map(_record, range(2))))
        assert files.done_chunks(out) == {0}
        assert (
            plan_batch(BatchConfig(input=source, output=out, checkpoint_dir="gs://x/ck")).pending
            == []
        )
        check = files.check_outputs(out, 2)
        assert (check.files, check.rows, check.exactly_once, check.stray) == (1, 2, True, ())


# -- the driver's wait on the pipeline: bounded, and ended by a lost host ---------------------


class _Pipeline:
    """What ``_summaries`` reads: ``iter_rows`` yields ``rows``, then waits (or raises)."""

    def __init__(self, rows, then=None):
        self.rows, self.then = rows, then
        self.release = threading.Event()

    def iter_rows(self):
        yield from self.rows
        if self.then is not None:
            raise self.then
        self.release.wait(30)  # a pipeline that never finishes (until the test ends)


class _Reservation:
    def __init__(self, lost_after_polls=None):
        self.polls, self.lost_after = 0, lost_after_polls

    def check_hosts(self):
        self.polls += 1
        if self.lost_after is not None and self.polls > self.lost_after:
            raise RuntimeError("host lost: slice batch-0 host 1")


SUMMARY = {"chunk": 0, "rows": 2, "tokens": 8, "seconds": 0.1, "cached_tokens": 0}


@pytest.fixture
def pipelines():
    made = []
    yield lambda *a, **k: made.append(_Pipeline(*a, **k)) or made[-1]
    for pipeline in made:
        pipeline.release.set()


@pytest.mark.parametrize(
    ("then", "lost_after", "deadline_s", "error", "fragment"),
    [
        (None, None, 0.3, TimeoutError, "not done within its timeout_s"),
        (None, 0, 30.0, RuntimeError, "host lost"),
        (ValueError("a chunk failed"), None, 30.0, ValueError, "a chunk failed"),
    ],
    ids=["times-out", "host-lost", "pipeline-error"],
)
def test_the_wait_on_the_pipeline_ends(pipelines, then, lost_after, deadline_s, error, fragment):
    from workloads.batch.job import _summaries

    row = {**SUMMARY, "host": "batch-0/0", "pid": 7}
    pipeline = pipelines([row], then)
    seen = []
    with pytest.raises(error, match=fragment):
        for done in _summaries(pipeline, _Reservation(lost_after), time.monotonic() + deadline_s):
            seen.append(done)
    assert [(d.chunk, d.host, d.pid) for d in seen] == [(0, "batch-0/0", 7)]
