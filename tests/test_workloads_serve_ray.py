"""Serving over real HTTP on a one-host simulated serving slice, behind the router with a CPU
replica of the same model as the fallback (``FallbackConfig("deployment")``):

- one poisoned request among good ones answers alone; the others come back 200 from one batch;
- the TPU replica drained (503 to every request): the CPU replica answers, and once the TPU
  replica takes requests again they are back on it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice, post_json
from workloads.sim.local_cluster import LocalSliceCluster, free_port

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

V6E_2X2 = shape("v6e", "2x2")
BATCH_WAIT_S = 8.0
"""Long enough that every good request sent at once joins the first batch (it fills no bucket
of 8, and batching is not adaptive here, so the batch waits the whole time): the batch is
deterministic, not a race."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A step-1 checkpoint of a freshly initialised model (serving needs one, not a good one)."""
    import jax

    from workloads.model import byte_lm as m
    from workloads.model.checkpoint import open_checkpoints, save_state
    from workloads.model.family import ByteLM
    from workloads.training.config import TrainConfig

    directory = tmp_path_factory.mktemp("serve") / "ck"
    cfg = m.ModelConfig.from_dict(TrainConfig(checkpoint_dir=str(directory)).model)
    manager = open_checkpoints(str(directory))
    try:
        save_state(manager, 1, m.init_state(cfg, jax.random.PRNGKey(0)), ByteLM(cfg))
        manager.wait_until_finished()
    finally:
        manager.close()
    return str(directory)


@pytest.fixture(scope="module")
def serving(checkpoint):
    from workloads.serving import app as serving_module
    from workloads.serving.fallback import FallbackConfig
    from workloads.serving.replica import ServeOptions

    with LocalSliceCluster([SliceChoice("serve", V6E_2X2, 1)]):
        handle = serving_module.deploy(
            serving_module.build_app(
                checkpoint,
                V6E_2X2,
                options=ServeOptions(
                    batch_wait_s=BATCH_WAIT_S, adaptive=False, max_batch_size=4, precompile=False
                ),
                fallback=FallbackConfig("deployment"),
            ),
            port=free_port(),
            timeout_s=240,
        )
        try:
            yield handle
        finally:
            serving_module.shutdown()


POISONS = [
    (b'{"prompt": "The old \\ud800 teacher", "max_new_tokens": 4}', 422, "unpaired surrogate"),
    (b"[" * 8000 + b"]" * 8000, 400, "nested deeper than"),
]


@pytest.mark.parametrize(
    ("poison", "status", "fragment"), POISONS, ids=["lone-surrogate", "nested-8000-deep"]
)
def test_one_poisoned_request_among_three_good_ones(serving, poison, status, fragment):
    good = [
        json.dumps({"prompt": p, "max_new_tokens": 4, "temperature": 0}).encode()
        for p in ("The old teacher", "Where did", "In the morning")
    ]
    bodies = [good[0], poison, good[1], good[2]]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(
            pool.map(lambda raw: post_json(serving.url, None, raw=raw, timeout_s=120), bodies)
        )
    statuses = [r.status for r in replies]
    assert statuses == [200, status, 200, 200], [r.body for r in replies]
    assert fragment in replies[1].body["error"]
    ok = [replies[0], replies[2], replies[3]]
    # The three good requests ran together, as one batch of three.
    assert [r.body["batch_size"] for r in ok] == [3, 3, 3]
    assert [r.body["prompt"] for r in ok] == ["The old teacher", "Where did", "In the morning"]
    assert all(1 <= len(r.body["completion"]) <= 4 for r in ok)


def test_prompts_of_different_lengths_share_one_batch(serving):
    prompts = ("Where did", "The long one. " * 25, "In the morning")  # widths 16, 512, 16
    bodies = [
        json.dumps({"prompt": p, "max_new_tokens": 4, "temperature": 0}).encode() for p in prompts
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        replies = list(
            pool.map(lambda raw: post_json(serving.url, None, raw=raw, timeout_s=120), bodies)
        )
    assert [r.status for r in replies] == [200, 200, 200], [r.body for r in replies]
    assert [r.body["batch_size"] for r in replies] == [3, 3, 3]
    # The replica's 4 chips hold one row each of a batch of 4: a width group would still take
    # a row on every chip, so this batch prefills jointly (grouping: batches of 5 to 8 here).
    assert {r.body["prefill_groups"] for r in replies} == {1}


def test_a_drained_tpu_replica_falls_back_to_the_cpu_replica_and_back(serving):
    from ray import serve

    tpu = serve.get_deployment_handle("TextGenerator", serving.name)
    body = json.dumps({"prompt": "The old teacher", "max_new_tokens": 4}).encode()

    def ask():
        import requests

        reply = requests.post(serving.url, data=body, timeout=120)
        return reply.status_code, reply.headers.get("x-raytpu-served-by"), reply.json()

    assert tpu.drain.remote(True).result(timeout_s=30)
    try:
        status, served_by, reply = ask()
        assert (status, served_by) == (200, "fallback-cpu"), reply
        assert 1 <= len(reply["completion"]) <= 4
    finally:
        assert tpu.drain.remote(False).result(timeout_s=30) is False
    status, served_by, reply = ask()
    assert (status, served_by) == (200, "tpu"), reply
    router = serve.get_app_handle(serving.name)
    assert router.stats.remote().result(timeout_s=30)["fallbacks"] == 1
