"""Batch inference on a simulated cluster: a v6e 2x4 batch slice (2 hosts x 4 chips) and a v6e
2x2 serving slice (1 host), one local cluster for the module.

One batch run of 2,000 prompts with chunk 3's actor killed (SIGKILL) half-way through writing its
file: every prompt is then in the output exactly once, chunk 3 was written by another process
than the one killed, both hosts of the reserved slice (and only they) wrote; the completions
equal the Serve replica's for the same prompts, asked one at a time; and a chunk whose file is
deleted is redone byte for byte (its sampled rows too) by a second run, which does nothing else. And the command
itself, a second driver on the same cluster: its progress and its summary.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.batch import (
    batch_shape,
    prompt_text,
    serve_one_at_a_time,
    serve_shape,
    write_checkpoint,
    write_prompts,
)
from raytpu_cli.common import SliceChoice
from workloads.batch import files
from workloads.batch.job import BatchConfig, plan_batch, run_batch
from workloads.batch.predictor import KILL_MARKER
from workloads.sim.local_cluster import LocalSliceCluster

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

PROMPTS = 2000
CHUNK_ROWS = 128
MAX_NEW_TOKENS = 4
KILLED = 3
SERVED = 12
SAMPLED_FROM = 4


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("batch")


@pytest.fixture(scope="module")
def checkpoint(workdir):
    return write_checkpoint(str(workdir / "ck"), context_len=128)


@pytest.fixture(scope="module")
def cluster():
    slices = [SliceChoice("batch", batch_shape(), 1), SliceChoice("serve", serve_shape(), 1)]
    with LocalSliceCluster(slices) as running:
        yield running


@pytest.fixture(scope="module")
def config(workdir, checkpoint):
    """Greedy prompts, but every fifth (rows 4, 9, ...) sampled at temperature 0.8."""
    source = write_prompts(workdir / "prompts.jsonl", PROMPTS, MAX_NEW_TOKENS)
    lines = [json.loads(line) for line in source.read_text().splitlines()]
    for row in range(SAMPLED_FROM, PROMPTS, 5):
        lines[row]["temperature"] = 0.8
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return BatchConfig(
        input=str(source),
        output=str(workdir / "out"),
        checkpoint_dir=checkpoint,
        chunk_rows=CHUNK_ROWS,
        max_new_tokens=MAX_NEW_TOKENS,
        kill_chunk=KILLED,
        timeout_s=180,
    )


@pytest.fixture(scope="module")
def first_run(cluster, config):
    reserved = []
    result = run_batch(batch_shape(), plan_batch(config), on_reserved=reserved.append)
    return result, reserved[0]


def test_a_killed_actor_is_recovered_and_every_prompt_is_written_exactly_once(first_run, config):
    result, reservation = first_run
    check = result.check
    assert (check.exactly_once, check.rows, check.stray) == (True, PROMPTS, ())
    assert check.files == len(files.chunks(PROMPTS, CHUNK_ROWS))
    # Every chunk reported once, by the one run: the killed attempt never reported.
    assert sorted(c.chunk for c in result.chunks_written) == list(range(check.files))
    marker = files.join(config.output, KILL_MARKER.format(chunk=KILLED))
    killed_pid = int(Path(marker).read_text())
    (redone,) = [c for c in result.chunks_written if c.chunk == KILLED]
    assert redone.pid != killed_pid  # a new actor process wrote it
    # One actor per host of the reserved slice, and only those hosts.
    hosts = {f"{h.slice_name}/{h.worker_id}" for h in reservation.hosts}
    assert hosts == {"batch-0/0", "batch-0/1"}
    assert {c.host for c in result.chunks_written} == hosts
    records = files.read_outputs(config.output)
    assert [r["row"] for r in records] == list(range(PROMPTS))
    assert all(len(r["tokens"]) == MAX_NEW_TOKENS for r in records)
    assert {r["temperature"] for r in records[SAMPLED_FROM::5]} == {0.8}
    assert {r["temperature"] for r in records[:SAMPLED_FROM]} == {0.0}
    greedy = [r["completion"] for r in records if r["temperature"] == 0]
    assert len(set(greedy)) > 100  # the model is not constant
    assert sum(c.cached_tokens for c in result.chunks_written) > 0  # the prefix cache served


def test_completions_equal_the_serve_replica_asked_one_at_a_time(first_run, checkpoint, config):
    """Greedy rows from every chunk (the killed one's too), and sampled rows asked with the
    seed the batch wrote for them: the same tokens, though each ran in another batch."""
    records = {r["row"]: r for r in files.read_outputs(config.output)}
    rows = [r * 150 for r in range(SERVED)] + list(range(SAMPLED_FROM, 160, 50))
    sampled = {
        i: (records[r]["temperature"], records[r]["seed"])
        for i, r in enumerate(rows)
        if records[r]["temperature"] > 0
    }
    assert len(sampled) >= 3
    asked = [prompt_text(r) for r in rows]
    served = serve_one_at_a_time(
        checkpoint, asked, MAX_NEW_TOKENS, precompile=False, sampled=sampled
    )
    assert [records[r]["prompt"] for r in rows] == asked
    assert [records[r]["completion"] for r in rows] == served["completions"]


def test_a_deleted_chunk_is_redone_byte_for_byte_and_nothing_else(first_run, config):
    """Sampled rows too: each row's seed comes from the job's seed and its row number."""
    before = {c: Path(files.part_path(config.output, c)).read_bytes() for c in (0, KILLED, 15)}
    for chunk in (0, 15):
        Path(files.part_path(config.output, chunk)).unlink()
    plan = plan_batch(config)
    assert (plan.resumed, plan.pending) == (True, [0, 15])
    again = run_batch(batch_shape(), plan)
    assert sorted(c.chunk for c in again.chunks_written) == [0, 15]
    assert again.skipped_chunks == len(plan.chunks) - 2
    assert again.check.exactly_once
    after = {c: Path(files.part_path(config.output, c)).read_bytes() for c in before}
    assert after == before
    assert plan_batch(config).pending == []


def test_the_command_shows_its_progress_and_writes_once(cluster, first_run, workdir, checkpoint):
    """``raytpu batch --address`` in its own process, a second driver on the module's cluster,
    on its one-host serving slice (free again: Serve was shut down)."""
    source = write_prompts(workdir / "cli" / "prompts.jsonl", 256, MAX_NEW_TOKENS)
    output = workdir / "cli" / "out"
    argv = [sys.executable, "-m", "raytpu_cli", "batch", "--generation", "v6e", "--topology"]
    argv += ["2x2", "--address", cluster.address, "--input", str(source), "--output", str(output)]
    argv += ["--checkpoint-dir", checkpoint, "--max-new-tokens", str(MAX_NEW_TOKENS)]
    argv += ["--log-file", str(workdir / "cli" / "batch.log")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "256 prompts in 2 chunks of 128; 2 to do" in done.stdout
    assert "256/256" in done.stdout  # the progress bar, finished
    assert re.search(r"exactly once +yes", done.stdout)
    assert re.search(r"hosts +serve-0/0: 256", done.stdout)
    assert files.check_outputs(str(output), 256).exactly_once
