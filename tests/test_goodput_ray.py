"""Goodput on the simulated slice cluster: one run with every fault injected, one without.

One v6e 2x4 slice on two 4-chip hosts, checkpoints on the GCS emulator (durable tier) and each
host's own working dir (fast tier). The faulty run, checked event by event:

- ``kill-host@8:1``: host 1 loses its disk and its worker dies -> attempt 2 restores the fast
  tier's step 5 (host 1 gets it from host 0), 3 steps lost (< ``fast_every``);
- ``spike@12``: a corrupt batch at step 12 -> a loss spike; policy ``rollback``: both hosts go
  back to the fast tier's step 10 and train on without batch 12 (the left-out batch outlives the
  restart that follows);
- ``hang@17:1``: host 1 stops -> every worker's watchdog fires within its bound, stacks dumped,
  attempt 3 restores the fast tier's step 15;
- ``slow-host@19:0``: host 0 slows down from step 19 -> flagged, naming host 0; policy
  ``restart``, but no spare slice: a warning (the move itself: ``tests/test_multislice_ray.py``).

The clean run has the same spike (the same rollback, the same batch left out) and nothing else:
both must end with the same parameters, bit for bit.

And a Hugging Face Llama: a tiny one with random weights made by ``transformers`` (its Flax
Llama, safetensors) and the corpus's ``tokenizer.json``, in the bucket; imported
(``scale.init_from``: its config.json is the ``tiny`` preset's shape, FSDP over the slice's 8
chips, each host reading only its shards) and trained by the same worker loop: ``kill-host@3:1``
and ``hang@6:1``, each recovered from the fast tier (the sharded state gathered on every host),
the run finished; then exported back to a Hugging Face folder in the bucket and that folder
served over the OpenAI API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gcs_fixture import gcs_or_skip

from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice
from workloads.sim.local_cluster import LocalSliceCluster
from workloads.training.goodput import GoodputConfig

pytestmark = [pytest.mark.ray, pytest.mark.long, pytest.mark.timeout(420)]

V6E_2X4_4T = shape("v6e", "2x4", machine_type="ct6e-standard-4t")
BUCKET = "raytpu-goodput"
STEPS = 24
HOSTS = ("train-0/0", "train-0/1")
MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "seq_len": 32}
MODEL |= {"learning_rate": 1e-2, "warmup_steps": 2}
"""Tiny, and fast to learn: by step 12 a batch of random bytes is a clear spike."""
HANG_FLOOR_S = 6.0
GOODPUT = dict(
    fast_every=5, hang_floor_s=HANG_FLOOR_S, startup_timeout_s=120.0, slow_fraction=0.6,
    slow_steps=3, slow_min_excess_s=0.3, spike_k=8.0, spike_window=6, spike_min_history=6,
    spike_policy="rollback",
)  # fmt: skip


@pytest.fixture(scope="module")
def cluster():
    with (
        gcs_or_skip(BUCKET) as gcs,
        LocalSliceCluster([SliceChoice("train", V6E_2X4_4T, 1)], env=gcs.env) as cluster,
    ):
        yield cluster


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("goodput-logs")


def _config(
    logs: Path,
    run: str,
    faults: tuple[str, ...],
    steps: int = STEPS,
    checkpoint_every: int = 20,
    **goodput,
):
    from workloads.training.config import TrainConfig

    return TrainConfig(
        checkpoint_dir=f"gs://{BUCKET}/{run}",
        steps=steps,
        global_batch=16,
        checkpoint_every=checkpoint_every,
        log_every=100,
        model=MODEL,
        goodput=GoodputConfig(**{**GOODPUT, **goodput}, faults=faults, log_dir=str(logs / run)),
    )


@pytest.fixture(scope="module")
def runs(cluster, logs):
    from workloads.training.driver import run_training

    clean = run_training(V6E_2X4_4T, _config(logs, "clean", ("spike@12",)), name="clean")
    faults = ("kill-host@8:1", "spike@12", "hang@17:1", "slow-host@19:0")
    faulty = run_training(
        V6E_2X4_4T,
        _config(logs, "faulty", faults, slow_policy="restart"),
        name="faulty",
    )
    return clean, faulty, cluster


def _host(result, process_index: int) -> str:
    (placement,) = [p for p in result.placements if p.process_index == process_index]
    return f"{placement.slice_name}/{placement.tpu_worker_id}"


ROLLBACK = ("loss_spike", 12, "rollback to step 10")


def test_clean_run_rolls_back_at_the_spike_and_nothing_else(runs):
    clean, _, _ = runs
    assert [(e.kind, e.step, e.action) for e in clean.events] == [ROLLBACK]
    assert clean.steps_run == STEPS + 2, "steps 10 and 11 trained again"
    assert (clean.attempts, clean.restores, clean.final_step) == (1, (("none", 0),), STEPS)
    assert 0 < clean.goodput <= 1


def test_faulty_run_recovers_from_each_fault_in_order(runs):
    _, faulty, _ = runs
    kinds = [(e.kind, e.step) for e in faulty.events]
    assert kinds == [
        ("host_loss", 8),
        ("loss_spike", 12),
        ("hang", 17),
        ("slow_host", 22),
    ], faulty.events
    assert faulty.attempts == 3
    assert faulty.restores == (("none", 0), ("fast", 5), ("fast", 15))
    assert faulty.final_step == STEPS and faulty.latest_checkpoint == STEPS
    # The restarts cost wall time; slow steps still count as productive (they made progress).
    assert 0 < faulty.goodput <= 1 and faulty.wall_s > runs[0].wall_s


@pytest.fixture(scope="module")
def slice_lost(cluster, logs, runs):
    """Every host of the run's slice goes at step 16 (``kill-slice``, GKE's repair of a
    multi-host slice); a durable checkpoint every 10 steps, the clean run's spike at 12."""
    from workloads.training.driver import run_training

    config = _config(logs, "slice-lost", ("spike@12", "kill-slice@16:1"), checkpoint_every=10)
    before = {(p.slice_name, p.tpu_worker_id): p.node_id for p in runs[0].placements}
    replaced_before = len(cluster.replaced)
    result = run_training(V6E_2X4_4T, config, name="slice-lost")
    return result, before, cluster.replaced[replaced_before:]


def test_a_lost_slice_is_replaced_whole_and_the_run_resumes_from_the_durable_tier(runs, slice_lost):
    clean = runs[0]
    result, before, replaced = slice_lost
    kinds = [(e.kind, e.step) for e in result.events]
    assert kinds == [("loss_spike", 12), ("slice_loss", 16)], result.events
    lost = result.events[1]
    # Both hosts' disks went with the slice: the fast tier at step 15 is gone, the durable one
    # at step 10 is the newest left.
    assert lost.action.endswith("resumed from the durable tier at step 10"), lost
    assert result.restores == (("none", 0), ("durable", 10)) and result.attempts == 2
    # Replaced whole: every host of the slice, each once, new node ids, the same shape.
    assert sorted(replaced) == [("train-0", 0), ("train-0", 1)], replaced
    after = {(p.slice_name, p.tpu_worker_id): p.node_id for p in result.placements}
    assert set(after) == set(before) and not set(after.values()) & set(before.values())
    assert result.params_digest == clean.params_digest


PRESET_STEPS = 8
HF_SOURCE = f"gs://{BUCKET}/hf/tiny"
HF_TRAINED = f"gs://{BUCKET}/hf/tiny-trained"


@pytest.fixture(scope="module")
def hf_source(cluster, tmp_path_factory) -> str:
    """``transformers``' random tiny Llama (the ``tiny`` preset's shape) and the corpus's BPE
    tokenizer, saved as its ``save_pretrained`` writes them and copied to the bucket."""
    import gcsfs
    import transformers

    from raytpu.presets import preset
    from workloads.data.corpus import load_corpus
    from workloads.data.text_data import tokenizer_json

    tiny = preset("tiny")
    config = transformers.LlamaConfig(
        vocab_size=tiny.vocab_size, hidden_size=tiny.d_model, intermediate_size=tiny.d_ff,
        num_hidden_layers=tiny.n_layers, num_attention_heads=tiny.n_heads,
        num_key_value_heads=tiny.n_kv_heads, max_position_embeddings=tiny.seq_len,
        rope_theta=tiny.rope_theta, tie_word_embeddings=False,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("hf") / "tiny"
    transformers.FlaxLlamaForCausalLM(config, seed=0).save_pretrained(
        folder, safe_serialization=True
    )
    (folder / "tokenizer.json").write_text(tokenizer_json(load_corpus(), tiny.vocab_size))
    bucket = gcsfs.GCSFileSystem(token="anon")
    for path in sorted(folder.iterdir()):
        bucket.put_file(str(path), f"{HF_SOURCE}/{path.name}")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {
        name.rsplit("/", 1)[-1] for name in bucket.ls(HF_SOURCE, refresh=True)
    }
    return HF_SOURCE


@pytest.fixture(scope="module")
def preset_run(cluster, logs, hf_source):
    """The Hugging Face tiny Llama imported: host 1 killed at step 3, host 1 hung at step 6
    (fast tier every 2)."""
    from raytpu.presets import MeshConfig, ScaleConfig
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training

    goodput = GoodputConfig(
        fast_every=2, hang_floor_s=HANG_FLOOR_S, startup_timeout_s=120.0, spike_k=100.0,
        faults=("kill-host@3:1", "hang@6:1"), log_dir=str(logs / "preset"),
    )  # fmt: skip
    config = TrainConfig(
        checkpoint_dir=f"gs://{BUCKET}/preset", steps=PRESET_STEPS, global_batch=16,
        checkpoint_every=PRESET_STEPS, log_every=100, goodput=goodput,
    )  # fmt: skip
    scale = ScaleConfig(mesh=MeshConfig.fsdp_over(V6E_2X4_4T.chips), init_from=hf_source)
    return run_training(V6E_2X4_4T, config, scale=scale, name="preset")


@pytest.fixture(scope="module")
def hf_trained(preset_run) -> str:
    """The run's last checkpoint exported to a Hugging Face folder in the bucket."""
    from workloads.model import hf_llama

    hf_llama.export_checkpoint(preset_run.checkpoint_dir, HF_TRAINED)
    return HF_TRAINED


RECOVERIES = {
    # family: (fixture, its events' index of the host loss and of the hang, the fast steps)
    "byte-lm": ("runs", (0, 2), (5, 15)),
    "preset": ("preset_run", (0, 1), (2, 6)),
}


@pytest.mark.parametrize("family", list(RECOVERIES), ids=list(RECOVERIES))
def test_a_killed_host_and_a_hang_are_recovered_from_the_fast_tier(request, family):
    """The same worker loop recovers either family: the lost host gets the fast tier from its
    peer, the hang is caught by the watchdog; both attempts resume and the run finishes."""
    fixture, (lost_at, hung_at), (after_loss, after_hang) = RECOVERIES[family]
    value = request.getfixturevalue(fixture)
    result = value[1] if family == "byte-lm" else value
    loss, hang = result.events[lost_at], result.events[hung_at]
    assert (loss.kind, hang.kind) == ("host_loss", "hang"), result.events
    assert loss.action.endswith(f"resumed from the fast tier at step {after_loss}")
    assert hang.action.endswith(f"resumed from the fast tier at step {after_hang}")
    assert hang.host in HOSTS and loss.host in HOSTS
    assert result.restores == (("none", 0), ("fast", after_loss), ("fast", after_hang))
    assert result.attempts == 3 and result.final_step == result.latest_checkpoint
    if family == "preset":
        assert [(e.kind, e.step) for e in result.events] == [("host_loss", 3), ("hang", 6)]
        assert result.final_step == PRESET_STEPS and result.scale["preset"] == "tiny"
        assert result.scale["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}


def test_the_imported_model_trained_from_its_weights_and_was_exported(hf_source, hf_trained):
    """The exported folder is the source's shape and tokenizer, its weights moved by training
    but only as far as 8 AdamW steps move them (lr 3e-3): a run that had started from its own
    random init (embeddings of std 1, not transformers' 0.02) would be far off."""
    import dataclasses

    import jax
    import numpy as np

    from workloads.model import hf_llama

    source, trained = hf_llama.load_family(hf_source), hf_llama.load_family(hf_trained)
    same_shape = dataclasses.replace(trained.preset, name="tiny", source=source.preset.source)
    assert same_shape == source.preset and trained.tokenizer == source.tokenizer
    before = hf_llama.load_params(hf_source, source.preset)
    after = hf_llama.load_params(hf_trained, trained.preset)
    moved = [float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))
             for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)]  # fmt: skip
    assert 0 < max(moved) < 0.05, moved


def test_the_exported_folder_is_served_over_the_openai_api(hf_trained):
    """The Hugging Face folder the run exported, served by Ray Serve on a host of the slice
    and asked through the ``openai`` client: completions (greedy: the tokens the folder's own
    weights give here, by the KV-cached engine, the second time from its prefix cache) and
    chat."""
    import openai

    from workloads.data.corpus import load_corpus
    from workloads.serving import app as serving
    from workloads.serving.replica import ServeOptions
    from workloads.sim.local_cluster import free_port

    options = ServeOptions(max_batch_size=1, shared_prefix=False, precompile=False)
    application = serving.build_app(
        hf_trained,
        tpu_per_replica=V6E_2X4_4T.chips_per_host,
        num_replicas=1,
        options=options,
    )
    handle = serving.deploy(application, port=free_port(), timeout_s=240)
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", timeout=120)
        assert [m.id for m in client.models.list()] == [options.model_name]
        prompt = load_corpus()[:160]  # over two prefix-cache blocks of the folder's tokens
        cold, warm = (
            client.completions.create(
                model=options.model_name, prompt=prompt, max_tokens=5, temperature=0
            )
            for _ in range(2)
        )
        assert cold.usage.completion_tokens == 5
        assert cold.choices[0].text == warm.choices[0].text == _greedy(hf_trained, prompt, 5)
        hits = [done.model_extra["raytpu"]["prefix_cached_tokens"] for done in (cold, warm)]
        assert hits[0] == 0 and hits[1] >= 32, hits
        chat = client.chat.completions.create(
            model=options.model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
        )
        assert chat.choices[0].message.role == "assistant"
    finally:
        serving.shutdown()


def _greedy(folder: str, prompt: str, tokens: int) -> str:
    """``tokens`` greedy tokens after ``prompt`` from the folder's weights, in this process,
    by the cache-free reference (every token re-runs the whole sequence)."""
    from workloads.model import hf_llama
    from workloads.serving.engine.decode import generate_tokens_uncached
    from workloads.serving.engine.decoders import LlamaDecoder

    family = hf_llama.load_family(folder)
    params = hf_llama.load_params(folder, family.preset)
    decoder = LlamaDecoder(family, family.preset.seq_len)
    (new,) = generate_tokens_uncached(params, decoder, [prompt], [tokens], [0.0])
    return decoder.decode(new)


def test_lost_host_resumes_from_the_fast_tier_of_its_peer(runs):
    _, faulty, _ = runs
    loss = faulty.events[0]
    assert loss.host in HOSTS  # process 1 of attempt 1 (Ray may place the processes anew)
    assert loss.action == "restart from the newest checkpoint: resumed from the fast tier at step 5"
    assert loss.step - 5 <= GOODPUT["fast_every"]
    assert loss.duration_s > 0


def test_hang_is_detected_within_bound_with_every_workers_stacks(runs):
    _, faulty, _ = runs
    hang = faulty.events[2]
    assert hang.host in HOSTS, hang
    assert hang.action.endswith("resumed from the fast tier at step 15")
    waited = float(hang.detail.split("no step for ")[1].split(" s")[0])
    assert HANG_FLOOR_S <= waited < HANG_FLOOR_S + 3, hang.detail
    stacks = [Path(p) for p in hang.detail.split("stacks of 2 worker(s): ")[1].split(", ")]
    assert sorted(p.name for p in stacks) == ["attempt-1-train-0-0.txt", "attempt-1-train-0-1.txt"]
    dumps = {p.name: p.read_text() for p in stacks}
    culprit = dumps[f"attempt-1-{hang.host.replace('/', '-')}.txt"]
    assert (
        "workloads/training/faults.py" in culprit and " in apply" in culprit
    )  # the injected sleep
    assert all(" in on_hang" in text for text in dumps.values())


def test_slow_host_is_named_and_warned_with_no_spare_slice(runs):
    _, faulty, _ = runs
    slow = faulty.events[3]
    assert slow.host == _host(faulty, 0)
    assert slow.action == "warned (no spare slice to move to)"
    assert "own time" in slow.detail


def test_spike_is_detected_at_its_step_and_rolled_back(runs):
    _, faulty, _ = runs
    spike = faulty.events[1]
    assert (spike.kind, spike.step, spike.action) == ROLLBACK
    assert "MAD" in spike.detail


def test_interrupted_run_ends_with_the_same_parameters_as_the_clean_one(runs):
    clean, faulty, _ = runs
    assert faulty.params_digest == clean.params_digest


def test_events_are_in_the_run_log(runs):
    _, faulty, _ = runs
    lines = Path(faulty.log_dir, "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == [e.kind for e in faulty.events]


PREEMPT_STEPS = 150
"""Long enough that the preempted host is still training at its deadline: 12 s after the drain,
about 80 steps at ~0.15 s a step here (fewer on a loaded machine), reading the notice every
step; the steps after the restart are what the run costs beyond that."""
GRACE_S = 12.0
"""With 8 s, a run beside another heavy test module started its emergency save with 7.2 s
left and did not finish it before the deadline."""


def _preemptions(result) -> list:
    """The run's preemption events; on a loaded machine a warning may stand beside them."""
    return [e for e in result.events if e.kind == "preemption"]


@pytest.fixture(scope="module")
def preempted(cluster, logs):
    """JAX process 1's host gets a preemption notice at step 3 (its node drained, deadline 12 s
    ahead), goes away at the deadline and a new host takes its place; no checkpoint is planned
    before the last step, so the restart can only resume from the emergency one."""
    from workloads.training.driver import run_training

    config = _config(
        logs, "preempted", ("preempt@3:1",), steps=PREEMPT_STEPS, preempt_grace_s=GRACE_S,
        checkpoint_timeout_s=60.0, spike_k=100.0, preempt_check_every=1,
        checkpoint_every=PREEMPT_STEPS, fast_every=0,  # the emergency one is the only checkpoint
        slow_min_excess_s=30.0,  # the drained host's peer waits out its emergency save: not slow
    )  # fmt: skip
    replaced_before = len(cluster.replaced)
    return run_training(V6E_2X4_4T, config, name="preempted"), cluster.replaced[replaced_before:]


def test_a_preempted_host_saves_an_emergency_checkpoint_and_the_run_resumes(preempted):
    result, replaced = preempted
    (notice,) = _preemptions(result)
    assert notice.host in HOSTS, result.events
    others = [e.kind for e in result.events if e is not notice]
    assert not set(others) & {"hang", "host_loss", "failure"}, result.events
    assert notice.step >= 3
    assert f"emergency durable checkpoint at step {notice.step}" in notice.detail, notice
    assert result.attempts == 2 and result.final_step == PREEMPT_STEPS
    assert result.restores == (("none", 0), ("durable", notice.step))
    assert notice.action.endswith(f"resumed from the durable tier at step {notice.step}")
    # The node pool replaced the preempted host (the one JAX process 1 ran on: Ray may place
    # the processes either way round).
    assert [f"{s}/{w}" for s, w in replaced] == [notice.host]


def test_the_emergency_checkpoint_is_in_the_durable_tier(preempted):
    from workloads.model.checkpoint import open_checkpoints

    result, _ = preempted
    manager = open_checkpoints(f"gs://{BUCKET}/preempted")
    try:
        assert _preemptions(result)[0].step in manager.all_steps()
    finally:
        manager.close()


OWN_STEPS = 8
OWN_KILLED_AT = 5
OWN_FAST_EVERY = 2
OWN_SLICE = "own-train"
"""The run's ``slice`` label (``RAYTPU_SLICE`` on the driver, as the stack sets it): its series
are told apart from the other runs' of this module."""
SERIES_TIMEOUT_S = 40.0
"""A worker reports its metrics to its node's agent every 10 s (Ray's default); the agent keeps
a dead worker's series 120 s."""


def _scrape() -> dict[str, list[dict[str, str]]]:
    """Every alive Ray node's Prometheus export: series name -> each sample's labels."""
    import urllib.request

    import ray
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, list[dict[str, str]]] = {}
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            found.setdefault(family.name, []).extend(s.labels for s in family.samples)
    return found


def _own_series(labels: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each series the run must leave (its PromQL name) -> the labels one sample must carry."""
    from raytpu import metric_names as mn

    worker = [mn.TRAIN_STEPS, mn.TRAIN_STEP_SECONDS, mn.TRAIN_LOSS, mn.TRAIN_TOKENS_PER_S]
    wanted = {m.promql: labels for m in (*worker, mn.TRAIN_MFU, mn.TRAIN_GOODPUT)}
    wanted[mn.CHECKPOINT_SECONDS.promql] = {**labels, "operation": "restore"}
    for spec in (mn.TRAIN_FAULT_EVENTS, mn.TRAIN_RECOVERY_SECONDS):
        wanted[spec.promql] = {**labels, "event_class": "host_loss"}
    wanted[mn.ERRORS.promql] = {**labels, "workload": "train"}
    return wanted


def _missing(wanted: dict[str, dict[str, str]], found: dict[str, list[dict[str, str]]]):
    return sorted(
        name
        for name, labels in wanted.items()
        if not any(labels.items() <= sample.items() for sample in found.get(name, ()))
    )


def _series_until(wanted: dict[str, dict[str, str]]) -> dict[str, list[dict[str, str]]]:
    """Scrape until every wanted series is there, or :data:`SERIES_TIMEOUT_S`."""
    import time

    deadline = time.monotonic() + SERIES_TIMEOUT_S
    found = _scrape()
    while _missing(wanted, found) and time.monotonic() < deadline:
        time.sleep(1.0)
        found = _scrape()
    return found


@dataclass(frozen=True)
class OwnRun:
    """The own-model run and what it left."""

    result: Any
    family: Any
    run_s: float
    wanted: dict[str, dict[str, str]]
    """Each series the run must leave -> the labels one of its samples must carry."""
    found: dict[str, list[dict[str, str]]]
    series_s: float
    """How long after the run every wanted series was there (or the timeout)."""


@pytest.fixture(scope="module")
def own_model_run(cluster, logs, tmp_path_factory):
    """The example of ``docs/workloads/own-model.md`` (a Flax char GRU, not one of ours), imported
    from a file as a user's script is and trained through ``run_training(..., family=...)``:
    host 1 killed at step 5, the fast tier every 2 steps; then the run's metric series read from
    every Ray node's Prometheus export (:class:`OwnRun`)."""
    import os
    import sys
    import time

    from test_own_model import doc_example

    from raytpu import metric_names as mn
    from workloads import telemetry
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training

    module = doc_example(tmp_path_factory.mktemp("own-model"), "own_char_gru")
    goodput = GoodputConfig(
        fast_every=OWN_FAST_EVERY, hang_floor_s=HANG_FLOOR_S, startup_timeout_s=120.0,
        spike_k=100.0, faults=(f"kill-host@{OWN_KILLED_AT}:1",), log_dir=str(logs / "own-model"),
    )  # fmt: skip
    config = TrainConfig(
        checkpoint_dir=f"gs://{BUCKET}/own-model", steps=OWN_STEPS, global_batch=16,
        checkpoint_every=OWN_STEPS, log_every=100, goodput=goodput,
    )  # fmt: skip
    family = module.CharGRUFamily()
    previous = os.environ.get(mn.SLICE_ENV)
    os.environ[mn.SLICE_ENV] = OWN_SLICE
    try:
        labels = telemetry.labels_for(V6E_2X4_4T).tags()
        began = time.monotonic()
        result = run_training(V6E_2X4_4T, config, family=family, name="own-model")
        seconds = time.monotonic() - began
    finally:
        if previous is None:
            os.environ.pop(mn.SLICE_ENV, None)
        else:
            os.environ[mn.SLICE_ENV] = previous
    wanted = _own_series(labels)
    found = _series_until(wanted)
    yield OwnRun(result, family, seconds, wanted, found, time.monotonic() - began - seconds)
    sys.modules.pop(module.__name__, None)


def test_own_model_run_recovers_the_killed_host_from_the_fast_tier(own_model_run):
    from orbax.checkpoint import args as ocp_args

    from workloads.model.checkpoint import open_checkpoints

    result, family = own_model_run.result, own_model_run.family
    print(f"own-model run: {own_model_run.run_s:.1f} s, series {own_model_run.series_s:.1f} s")
    fast = OWN_KILLED_AT // OWN_FAST_EVERY * OWN_FAST_EVERY
    assert [(e.kind, e.step) for e in result.events] == [("host_loss", OWN_KILLED_AT)]
    (loss,) = result.events
    assert loss.host in HOSTS and loss.action.endswith(f"resumed from the fast tier at step {fast}")
    assert result.restores == (("none", 0), ("fast", fast)) and result.attempts == 2
    assert result.final_step == result.latest_checkpoint == OWN_STEPS
    assert result.last_loss < result.first_loss, result.losses
    manager = open_checkpoints(result.checkpoint_dir)
    try:
        restored = manager.restore(OWN_STEPS, args=ocp_args.Composite(meta=ocp_args.JsonRestore()))
    finally:
        manager.close()
    assert restored.meta == {"step": OWN_STEPS, **family.to_dict()}


def test_own_model_run_leaves_its_telemetry_series(own_model_run):
    """Process 0's step and checkpoint series, the driver's goodput, fault, recovery and error
    series: each with the run's labels (stack, slice, generation, topology)."""
    wanted, found = own_model_run.wanted, own_model_run.found
    assert wanted["ray_raytpu_train_loss"] == {
        "stack": "local", "slice": OWN_SLICE, "generation": "v6e", "topology": "2x4",
    }  # fmt: skip
    assert _missing(wanted, found) == []
