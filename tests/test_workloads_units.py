"""Workloads without a Ray cluster: host specs, request validation, config checks, model, Orbax."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from raytpu.catalog import SliceShape, shape
from workloads.data import corpus
from workloads.serving.app import build_app
from workloads.serving.requests import (
    MAX_NEW_TOKENS,
    MAX_PROMPT_CHARS,
    PAD_REQUEST,
    GenerateRequest,
    RequestError,
    pad_to_bucket,
    parse_request,
)
from workloads.sim.local_cluster import LocalClusterError, LocalSliceCluster, host_specs
from workloads.training.config import TrainConfig

V6E_2X4_4T = shape("v6e", "2x4", machine_type="ct6e-standard-4t")
V6E_2X2 = shape("v6e", "2x2")
V5P_2X2X4 = shape("v5p", "2x2x4")


@dataclass(frozen=True)
class Slice:
    name: str
    shape: SliceShape
    count: int


# ------------------------------------------------------------------------ simulated hosts
@pytest.mark.parametrize(
    ("slices", "expected_hosts", "expected_names"),
    [
        ([Slice("train", V6E_2X4_4T, 1)], 2, ["train-0"]),
        (
            [Slice("train", V6E_2X4_4T, 2), Slice("serve", V6E_2X2, 1)],
            5,
            ["train-0", "train-1", "serve-0"],
        ),
        ([Slice("big", V5P_2X2X4, 1)], 4, ["big-0"]),
    ],
    ids=["dev-train", "two-train-copies-plus-serve", "v5p-2x2x4"],
)
def test_host_specs_one_node_per_host_per_copy(slices, expected_hosts, expected_names):
    hosts = host_specs(slices)
    assert len(hosts) == expected_hosts
    assert list(dict.fromkeys(h.slice_name for h in hosts)) == expected_names
    for host in hosts:
        shape_ = host.shape
        assert host.env["TPU_NAME"] == host.slice_name
        assert host.env["TPU_WORKER_ID"] == str(host.worker_id)
        assert host.env["TPU_ACCELERATOR_TYPE"] == shape_.pod_type
        assert host.env["TPU_TOPOLOGY"] == shape_.topology
        assert host.env["JAX_PLATFORMS"] == "cpu"
        assert host.env["XLA_FLAGS"].endswith(f"device_count={shape_.chips_per_host}")
        assert host.resources["TPU"] == shape_.chips_per_host
        assert host.resources[f"accelerator_type:{shape_.ray_accelerator_type}"] == 1
        assert host.resources[host.slice_name] == 1
        assert (shape_.ray_head_resource in host.resources) == (host.worker_id == 0)
        assert host.labels == {
            "ray.io/tpu-slice-name": host.slice_name,
            "ray.io/tpu-worker-id": str(host.worker_id),
            "ray.io/tpu-pod-type": shape_.pod_type,
            "ray.io/tpu-topology": shape_.topology,
            "ray.io/accelerator-type": shape_.ray_accelerator_type,
        }


def test_host_specs_pod_type_counts_tensorcores():
    (head, *_rest) = host_specs([Slice("big", V5P_2X2X4, 1)])
    assert head.env["TPU_ACCELERATOR_TYPE"] == "v5p-32"
    assert "TPU-v5p-32-head" in head.resources


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slices": [Slice("train", V6E_2X4_4T, 0)]}, "slices[train].count: 0 is not valid"),
        (
            {"slices": [Slice("train", V6E_2X4_4T, 1)], "missing_hosts": [("train-0", 7)]},
            "missing_hosts: ('train-0', 7) is not valid; valid: ('train-0', 0), ('train-0', 1)",
        ),
    ],
    ids=["zero-count", "unknown-missing-host"],
)
def test_local_cluster_rejects_bad_input_before_starting(kwargs, message):
    slices = kwargs.pop("slices")
    with pytest.raises(LocalClusterError) as caught:
        LocalSliceCluster(slices, **kwargs)
    assert message in str(caught.value)


def test_missing_hosts_drops_exactly_that_host():
    cluster = LocalSliceCluster([Slice("broken", V6E_2X4_4T, 1)], missing_hosts=[("broken-0", 1)])
    assert [(h.slice_name, h.worker_id) for h in cluster.hosts] == [("broken-0", 0)]


# ------------------------------------------------------------------------ serve validation
GOOD = {"prompt": "Hello", "max_new_tokens": 8, "temperature": 0.5}


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "valid: UTF-8 text"),
        (b'{"prompt": "\xff"}', 400, "byte 0xff is not UTF-8"),
        (b'{"prompt": "a\\ud800b"}', 422, "prompt: character 1 ('\\ud800') is an unpaired"),
        (b'{"prompt": "\\udfff"}', 422, "unpaired surrogate"),
        (b"[" * 8000 + b"]" * 8000, 400, "nested deeper than 8 levels; valid: at most 8"),
        (b'{"prompt": "a", "max_new_tokens": ' + b"9" * 5000 + b"}", 400, "not valid JSON"),
        (json.dumps(["a"]).encode(), 400, "body: 'list' is not valid; valid: a JSON object"),
        (json.dumps({}).encode(), 422, "prompt: None is not valid"),
        (json.dumps({**GOOD, "prompt": ""}).encode(), 422, "empty prompt"),
        (json.dumps({**GOOD, "prompt": "   "}).encode(), 422, "empty prompt"),
        (json.dumps({**GOOD, "prompt": 5}).encode(), 422, "prompt: 5 is not valid"),
        (json.dumps({**GOOD, "prompt": "x" * (MAX_PROMPT_CHARS + 1)}).encode(), 413, "too long"),
        (json.dumps({**GOOD, "max_new_tokens": 0}).encode(), 422, "max_new_tokens: 0"),
        (json.dumps({**GOOD, "max_new_tokens": MAX_NEW_TOKENS + 1}).encode(), 422, "1..256"),
        (json.dumps({**GOOD, "max_new_tokens": "8"}).encode(), 422, "max_new_tokens: '8'"),
        (json.dumps({**GOOD, "max_new_tokens": True}).encode(), 422, "max_new_tokens: True"),
        (json.dumps({**GOOD, "temperature": -0.1}).encode(), 422, "temperature: -0.1"),
        (json.dumps({**GOOD, "temperature": 9}).encode(), 422, "valid: a number 0..2"),
        (b'{"prompt": "a", "temperature": NaN}', 422, "temperature: nan"),
        (json.dumps({**GOOD, "top_k": 3}).encode(), 422, "top_k: unknown field"),
        (b"x" * 20_000, 413, "too large"),
    ],
    ids=[
        "bad-json",
        "not-utf8",
        "not-utf8-inside-a-string",
        "lone-high-surrogate",
        "lone-low-surrogate",
        "nested-8000-deep",
        "integer-of-5000-digits",
        "not-object",
        "missing-prompt",
        "empty-prompt",
        "blank-prompt",
        "prompt-not-string",
        "prompt-too-long",
        "zero-tokens",
        "too-many-tokens",
        "tokens-string",
        "tokens-bool",
        "negative-temperature",
        "hot-temperature",
        "nan-temperature",
        "unknown-field",
        "body-too-large",
    ],
)
def test_parse_request_rejects_with_4xx(body, status, fragment):
    with pytest.raises(RequestError) as caught:
        parse_request(body)
    assert caught.value.status == status
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (GOOD, (GOOD["prompt"], 8, 0.5)),
        ({"prompt": "Hi"}, ("Hi", 64, 0.8)),
        ({"prompt": "Hi", "temperature": 0}, ("Hi", 64, 0.0)),
    ],
    ids=["all-fields", "defaults", "greedy-int-temperature"],
)
def test_parse_request_accepts(raw, expected):
    parsed = parse_request(json.dumps(raw).encode())
    assert (parsed.prompt, parsed.max_new_tokens, parsed.temperature) == expected


@pytest.mark.parametrize(
    ("size", "padded"),
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (8, 8)],
    ids=lambda v: str(v),
)
def test_batches_pad_to_a_compiled_bucket(size, padded):
    requests = [GenerateRequest(prompt=f"p{i}") for i in range(size)]
    batch = pad_to_bucket(requests)
    assert len(batch) == padded
    assert batch[:size] == requests
    assert all(r == PAD_REQUEST for r in batch[size:])


@pytest.mark.parametrize("size", [0, 9], ids=["empty", "over-max"])
def test_pad_to_bucket_rejects_sizes_serve_batch_never_makes(size):
    with pytest.raises(ValueError, match=f"batch size: {size} is not valid; valid: 1..8"):
        pad_to_bucket([GenerateRequest(prompt="p")] * size)


def test_build_app_requests_the_serving_hosts_chips():
    app = build_app("/tmp/ck", V6E_2X2)
    options = app._bound_deployment.ray_actor_options
    assert options["resources"] == {"TPU": 4}
    assert options["label_selector"] == {
        "ray.io/tpu-pod-type": "v6e-4",
        "ray.io/tpu-topology": "2x2",
    }


def test_build_app_refuses_multi_host_shape():
    with pytest.raises(ValueError, match=r"serve slice: 'v6e 2x4 .* valid: a single-host shape"):
        build_app("/tmp/ck", V6E_2X4_4T)


# ------------------------------------------------------------------------ train config
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "train.steps: 0 is not valid"),
        (
            {"global_batch": 12},
            "train.global_batch: 12 is not valid; valid: a positive multiple of the 8",
        ),
        ({"checkpoint_every": 0}, "train.checkpoint_every: 0"),
        ({"log_every": 0}, "train.log_every: 0"),
    ],
    ids=["zero-steps", "batch-not-multiple-of-devices", "zero-checkpoint-every", "zero-log-every"],
)
def test_train_config_names_the_bad_field(kwargs, message):
    with pytest.raises(ValueError) as caught:
        TrainConfig(checkpoint_dir="/tmp/x", **kwargs).validate(V6E_2X4_4T, 1)
    assert message in str(caught.value)


# ------------------------------------------------------------------------ corpus
def test_shipped_corpus_is_the_generated_one():
    text = corpus.load_corpus()
    assert text == corpus.generate()
    assert len(text.encode()) >= 250_000
    assert text.isascii()


# ------------------------------------------------------------------------ model + Orbax (1 process)
def test_train_step_lowers_loss_on_a_fixed_batch():
    from functools import partial

    import jax
    import jax.numpy as jnp

    from workloads.model import byte_lm as m

    cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=32, warmup_steps=1)
    batch = jnp.asarray(m.sample_batch(m.encode(corpus.load_corpus()), 8, cfg.seq_len, seed=1))
    state = m.init_state(cfg, jax.random.PRNGKey(0))
    step = jax.jit(partial(m.train_step, cfg))
    losses = []
    for _ in range(10):
        state, loss = step(state, batch)
        losses.append(float(loss))
    assert int(state.step) == 10
    assert losses[-1] < 0.7 * losses[0]


def test_checkpoint_round_trip_restores_identical_parameters(tmp_path):
    import jax

    from workloads.model import byte_lm as m
    from workloads.model.checkpoint import open_checkpoints, restore_params, save_state
    from workloads.model.family import ByteLM

    cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=32)
    state = m.init_state(cfg, jax.random.PRNGKey(3))
    manager = open_checkpoints(str(tmp_path / "ck"))
    try:
        save_state(manager, 7, state, ByteLM(cfg))
        manager.wait_until_finished()
    finally:
        manager.close()
    params, family, step = restore_params(str(tmp_path / "ck"))
    assert step == 7
    assert family == ByteLM(cfg)
    assert m.params_digest(params) == m.params_digest(state.params)


def test_restore_params_from_empty_dir_names_it(tmp_path):
    from workloads.model.checkpoint import restore_params

    with pytest.raises(FileNotFoundError, match=r"checkpoint_dir: .* has no checkpoint"):
        restore_params(str(tmp_path / "nothing"))


def test_generate_respects_per_request_lengths():
    import jax

    from workloads.model import byte_lm as m
    from workloads.serving.engine import decode as d

    cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=32, context_len=64)
    params = m.init_state(cfg, jax.random.PRNGKey(0)).params
    outs = d.generate_tokens(params, cfg, ["ab", "a longer prompt"], [3, 7], [0.0, 1.0])
    assert [len(o) for o in outs] == [3, 7]
    assert all(0 <= t < m.VOCAB for row in outs for t in row)
    greedy = d.generate_tokens(params, cfg, ["ab"], [4], [0.0])
    assert greedy == d.generate_tokens(params, cfg, ["ab"], [4], [0.0], seed=99)


TINY_CONTEXT = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "context_len": 96}


@pytest.mark.parametrize(
    ("prompts", "lengths", "temperatures"),
    [
        (["ab", "a longer prompt than that", "x" * 70], [5, 9, 3], [0.0, 0.0, 0.0]),
        (["ab", "a longer prompt than that", "x" * 70], [5, 9, 3], [1.0, 0.7, 0.0]),
        (["y" * 200], [20], [0.0]),
    ],
    ids=["greedy-mixed-lengths", "sampled-same-seed", "prompt-longer-than-context"],
)
def test_kv_cached_decode_equals_the_uncached_reference(prompts, lengths, temperatures):
    import jax

    from workloads.model import byte_lm as m
    from workloads.serving.engine import decode as d

    cfg = m.ModelConfig(**TINY_CONTEXT)
    params = m.init_state(cfg, jax.random.PRNGKey(1)).params
    cached = d.generate_tokens(params, cfg, prompts, lengths, temperatures, seed=3)
    assert cached == d.generate_tokens_uncached(params, cfg, prompts, lengths, temperatures, 3)
    assert [len(row) for row in cached] == lengths


def test_decode_resumes_and_a_cached_prefix_block_replaces_its_prefill():
    """Chunks of a resumed decode equal one decode; a row whose first block is written from
    another cache (start > 0) continues exactly as if it had prefilled it."""
    import jax

    from workloads.model import byte_lm as m
    from workloads.serving.engine import decode as d

    cfg = m.ModelConfig(**TINY_CONTEXT)
    params = m.init_state(cfg, jax.random.PRNGKey(2)).params
    ids = [d.prompt_ids(cfg, "The system prompt. Then the user", 8)]
    whole = d.prefill(params, cfg, d.new_cache(cfg, 1, None), d.PrefillInputs.fresh(ids, [0.0], 5))
    block = d.read_block(cfg, whole.kv, 0, 0, 16)
    once, _ = d.decode(params, cfg, whole, 8)

    kv = d.write_block(cfg, d.new_cache(cfg, 1, None), block, 0, 0)
    state = d.prefill(params, cfg, kv, d.PrefillInputs(tuple(ids), (16,), (0.0,), (5,)))
    first, state = d.decode(params, cfg, state, 3)
    rest, _ = d.decode(params, cfg, state, 5)
    assert once.tolist() == [[*first[0].tolist(), *rest[0].tolist()]]


@pytest.mark.parametrize(
    ("cmdline", "named"),
    [
        ("raylet --gcs-address=192.0.2.2:4123 --node-id=x", True),
        ("ray start --address 192.0.2.2:4123 --block", True),
        ("raylet --gcs-address=192.0.2.2:41234", False),
        ("gcs_server --node-ip-address=10.192.0.2.2:4123", False),
        ("python -m pytest", False),
    ],
    ids=["flag", "argument", "longer-port", "longer-host", "unrelated"],
)
def test_a_cluster_kills_only_processes_that_name_its_whole_address(cmdline, named) -> None:
    from workloads.sim.local_processes import names_address

    assert names_address(cmdline, "192.0.2.2:4123") is named


@pytest.mark.parametrize(
    "start_up",
    ["swallowed", "then-failed"],
    ids=["signal-swallowed-by-start-up-code", "start-up-failed-after-the-signal"],
)
def test_an_interrupt_during_start_up_stops_the_cluster_and_is_not_retried(
    monkeypatch: pytest.MonkeyPatch, start_up: str
) -> None:
    """A Ctrl-C that Python ignored (raised inside logging's at-fork hook) or that killed the
    group's Ray processes (the start-up then fails) must stop the start, not retry it."""
    cluster = LocalSliceCluster([Slice("train", V6E_2X4_4T, 1)])
    calls: list[str] = []

    def start_once(began: float) -> None:
        calls.append("start")
        cluster.interrupted = "SIGINT"
        if start_up == "then-failed":
            raise RuntimeError("raylet died")

    monkeypatch.setattr(cluster, "_start_once", start_once)
    monkeypatch.setattr(cluster, "stop", lambda: calls.append("stop"))
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        cluster.start()
    assert calls == ["start", "stop"]


@pytest.mark.parametrize(
    ("failures", "timeout_s", "starts", "started"),
    [
        (2, 180.0, 3, True),
        (3, 180.0, 3, False),
        (1, 20.0, 1, False),
    ],
    ids=["third-try-starts", "every-try-fails", "no-time-left-for-another"],
)
def test_a_failed_start_up_is_tried_again_while_time_is_left(
    monkeypatch: pytest.MonkeyPatch, failures: int, timeout_s: float, starts: int, started: bool
) -> None:
    cluster = LocalSliceCluster([Slice("train", V6E_2X4_4T, 1)], start_timeout_s=timeout_s)
    calls: list[str] = []

    def start_once(began: float) -> None:
        calls.append("start")
        if calls.count("start") <= failures:
            raise RuntimeError("The current node timed out during startup")

    monkeypatch.setattr(cluster, "_start_once", start_once)
    monkeypatch.setattr(cluster, "stop", lambda: calls.append("stop"))
    if started:
        assert cluster.start() is cluster
    else:
        with pytest.raises(RuntimeError, match="timed out during startup"):
            cluster.start()
    assert calls.count("start") == starts
    assert calls.count("stop") == min(failures, starts)


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"ray.io/tpu-slice-name": "train-0", "ray.io/tpu-worker-id": "1"}, ("train-0", 1)),
        ({"ray.io/tpu-slice-name": "train-0"}, None),
        ({"ray.io/tpu-worker-id": "0"}, None),
        ({"ray.io/tpu-slice-name": "train-0", "ray.io/tpu-worker-id": "x"}, None),
        ({}, None),
    ],
    ids=["tpu-host", "no-worker-id", "no-slice", "bad-worker-id", "head"],
)
def test_host_key_names_a_tpu_host_by_its_labels(labels, expected):
    from raytpu.ray_names import host_key

    assert host_key(labels) == expected
