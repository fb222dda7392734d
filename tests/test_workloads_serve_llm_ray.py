"""The LLM-server features over real HTTP on one simulated v6e 2x2 serving host, one deployment
for every test: two TPU replicas (2 chips each) behind the router, an external OpenAI-compatible
stub as the fallback.

- the ``openai`` client library against the local endpoint: completions, chat, both streamed;
- a second replica hits a prefix the first cached (through the shared tier), and a hit skips
  prefill (fewer prefilled tokens, hit counters);
- fallback engages when the TPU replicas are past their queue bound and disengages after;
  a fallback that answers 429 gets bounded retries and the client a 429 with Retry-After;
- last (it kills the replicas): with both TPU replicas dead and no free chips for new ones,
  requests go to the fallback (after one waits ``tpu_timeout_s``, the router's breaker sends
  them straight there), and back to the TPU once the chips are free and Serve replaced them.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from upstream_stub import COMPLETION, upstream_stub

from raytpu.catalog import shape
from raytpu_cli.common import SliceChoice
from workloads.sim.local_cluster import LocalSliceCluster, free_port

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

V6E_2X2 = shape("v6e", "2x2")
MODEL = "raytpu-byte-lm"
SYSTEM = (
    "You are the station's assistant. Answer in one short sentence, politely, in English, "
    "and never invent a timetable. "
) * 6  # 702 bytes: 43 full blocks of 16


TPU_TIMEOUT_S = 10.0
PROBE_AFTER_S = 2.0


@pytest.fixture(scope="module")
def stub():
    with upstream_stub() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    import jax

    from workloads.model import byte_lm as m
    from workloads.model.checkpoint import open_checkpoints, save_state
    from workloads.model.family import ByteLM

    directory = str(tmp_path_factory.mktemp("llm") / "ck")
    cfg = m.ModelConfig()
    manager = open_checkpoints(directory)
    try:
        save_state(manager, 1, m.init_state(cfg, jax.random.PRNGKey(0)), ByteLM(cfg))
        manager.wait_until_finished()
    finally:
        manager.close()
    return directory


@pytest.fixture(scope="module")
def served(checkpoint, stub):
    from workloads.serving import app as serving
    from workloads.serving.fallback import FallbackConfig
    from workloads.serving.replica import ServeOptions

    fallback = FallbackConfig(
        "openai", stub.url, "stub", timeout_s=5, backoff_s=0.05, probe_after_s=PROBE_AFTER_S
    )
    with LocalSliceCluster([SliceChoice("serve", V6E_2X2, 1)]):
        app = serving.build_app(
            checkpoint,
            V6E_2X2,
            tpu_per_replica=2,
            num_replicas=2,
            # Batches of at most 2 (one bucket to compile), 1 request in flight per replica.
            options=ServeOptions(max_batch_size=2, max_queue=1),
            fallback=fallback,
            tpu_timeout_s=TPU_TIMEOUT_S,
        )
        handle = serving.deploy(app, port=free_port(), timeout_s=300)
        try:
            yield handle
        finally:
            serving.shutdown()


def post(url: str, body: dict) -> tuple[int, dict, dict]:
    import requests

    reply = requests.post(url, json=body, timeout=120)
    return reply.status_code, reply.json(), dict(reply.headers)


def test_openai_client_completions_and_chat_streamed_and_not(served):
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", timeout=120)
    assert [m.id for m in client.models.list()] == [MODEL]
    done = client.completions.create(model=MODEL, prompt="The old teacher", max_tokens=12)
    assert done.object == "text_completion" and done.usage.completion_tokens == 12
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=6
    )
    assert chat.choices[0].message.role == "assistant"
    streamed = client.completions.create(
        model=MODEL, prompt="The old teacher", max_tokens=20, temperature=0, stream=True
    )
    texts = [chunk.choices[0].text for chunk in streamed]
    assert len(texts) == 4  # 20 tokens: the first alone, then decode loops of 8: 1, 8, 8, 3
    greedy = client.completions.create(
        model=MODEL, prompt="The old teacher", max_tokens=20, temperature=0
    )
    assert "".join(texts) == greedy.choices[0].text
    chunks = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=9, stream=True
    )
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant" and len(deltas) == 2
    with pytest.raises(openai.NotFoundError, match="model: 'gpt-4' is not valid"):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.UnprocessableEntityError, match="max_tokens: 999 is not valid"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=999)


def test_a_second_replica_hits_the_prefix_the_first_cached_and_skips_its_prefill(served):
    import ray
    from ray import serve

    from workloads.serving.engine.prefix_cache import DIRECTORY_NAME, DIRECTORY_NAMESPACE

    shared = ray.get_actor(DIRECTORY_NAME, namespace=DIRECTORY_NAMESPACE)
    before = ray.get(shared.size.remote(), timeout=30)
    replies = []
    for index in range(12):  # two replicas, picked at random: the second one shows up soon
        status, body, headers = post(
            served.url, {"prompt": SYSTEM + f"Question {index}?", "max_new_tokens": 4}
        )
        assert status == 200 and headers["x-raytpu-served-by"] == "tpu", body
        replies.append(body)
        if body["prefix_tier"] == "shared":
            break
        if index == 0:  # the publish is fire and forget: wait until the directory has it
            deadline = time.monotonic() + 60
            while ray.get(shared.size.remote(), timeout=30) < before + 43:
                assert time.monotonic() < deadline, "the prefix never reached the shared tier"
                time.sleep(0.2)
    cold, *warm = replies
    assert cold["prefix_tier"] == "" and cold["prefix_cached_tokens"] == 0
    assert warm and warm[-1]["prefix_tier"] == "shared", [r["prefix_tier"] for r in replies]
    assert {r["prefix_cached_tokens"] for r in warm} == {688}  # 43 blocks; the last token runs
    # A hit skips prefill: the batch prefilled only the tokens past the cached prefix (the time
    # it saves is measured by bench/serving_llm.py, not asserted here).
    assert max(r["prefill_tokens"] for r in warm) < cold["prefill_tokens"], replies
    generator = serve.get_deployment_handle("TextGenerator", served.name)
    counts = [generator.describe.remote().result(timeout_s=60)["prefix"] for _ in range(6)]
    assert any(c["hits"]["shared"] >= 43 for c in counts), counts
    assert all(c["misses"] >= 0 for c in counts)


def test_fallback_engages_past_the_queue_bound_and_disengages_after(served, stub):
    stub.mode = "ok"
    body = {"model": MODEL, "prompt": "Where did the train go", "max_tokens": 48}

    def ask(_):
        return post(served.url + "/v1/completions", body)

    with ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(ask, range(8)))
    served_by = [headers["x-raytpu-served-by"] for _, _, headers in burst]
    assert all(status == 200 for status, _, _ in burst), burst
    assert "fallback-openai" in served_by and "tpu" in served_by, served_by
    texts = [b["choices"][0]["text"] for _, b, h in burst if h["x-raytpu-served-by"] != "tpu"]
    assert set(texts) == {COMPLETION}
    # Alone again: back on the TPU replicas (after PROBE_AFTER_S, in case a request of the burst
    # found the TPU deployment unreachable under load and opened the breaker).
    time.sleep(PROBE_AFTER_S)
    status, _, headers = ask(0)
    assert status == 200 and headers["x-raytpu-served-by"] == "tpu"

    stub.mode, stub.calls = "429", 0
    try:
        with ThreadPoolExecutor(8) as pool:
            limited = list(pool.map(ask, range(8)))
    finally:
        stub.mode = "ok"
    refused = [(s, b, h) for s, b, h in limited if s != 200]
    assert refused and all(s == 429 for s, _, _ in refused), limited
    assert all(h["retry-after"] == "3" for _, _, h in refused)
    assert all("RTPU-U01" in b["error"]["message"] for _, b, _ in refused)
    assert stub.calls == 3 * len(refused)  # max_attempts 3 per refused request, no more


def test_fallback_while_the_tpu_replicas_are_dead_and_back_to_them_once_replaced(served, stub):
    """Both TPU replicas die and their host's chips are taken at once (a reservation that was
    waiting for them: no free slice for the replacements), so the TPU deployment is down until
    the chips are free again; Serve then replaces the replicas."""
    import threading

    import ray
    from ray import serve

    from workloads.slices.reservation import reserve_slices

    stub.mode = "ok"
    body = {"model": MODEL, "prompt": "Where did the train go", "max_tokens": 8}
    url = served.url + "/v1/completions"

    def tpu_replicas() -> list[str]:  # Serve's replica actors: SERVE_REPLICA::APP#DEPLOYMENT#ID
        return [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "serve" and f"::{served.name}#TextGenerator#" in a["name"]
        ]

    def kill(names: list[str]) -> None:
        for name in names:
            with contextlib.suppress(ValueError):  # already gone
                ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)

    replicas = tpu_replicas()
    assert len(replicas) == 2, replicas
    held, release = threading.Event(), threading.Event()

    def hold_the_host():
        with reserve_slices(V6E_2X2, timeout_s=120, name="test-no-free-slice"):
            held.set()
            release.wait(300)

    holder = threading.Thread(target=hold_the_host, daemon=True)
    holder.start()
    time.sleep(1.0)  # the reservation waits: the replicas hold the host's chips
    assert not held.is_set()
    kill(replicas)  # both TPU replicas die, as with the serving host's loss
    try:
        # Serve's replacements race the waiting reservation for the freed chips, and a queued
        # actor lease takes them before the placement group's next try (on CI's loaded cores
        # they won twice over a 60 s window when killed every 2 s): kill them as soon as they are
        # named, pending or starting, so the chips stay free until the reservation holds them.
        deadline = time.monotonic() + 120
        while not held.wait(0.1):
            assert time.monotonic() < deadline, "the host's chips were not freed"
            kill(tpu_replicas())
        status, _, headers = post(url, body)  # waits tpu_timeout_s, then the fallback
        assert status == 200 and headers["x-raytpu-served-by"] == "fallback-openai"
        router = serve.get_app_handle(served.name)
        assert router.stats.remote().result(timeout_s=30)["breaker_opened"] >= 1
        began = time.monotonic()
        for _ in range(3):  # the breaker is open: no request waits for the dead replicas
            status, _, headers = post(url, body)
            assert status == 200 and headers["x-raytpu-served-by"] == "fallback-openai"
        assert time.monotonic() - began < TPU_TIMEOUT_S
    finally:
        release.set()
        holder.join(60)

    deadline = time.monotonic() + 300  # Serve places new replicas: JAX, checkpoint, compile
    served_by = []
    while not served_by or served_by[-1] != "tpu":
        assert time.monotonic() < deadline, served_by
        status, _, headers = post(url, body)
        assert status == 200, headers
        served_by.append(headers["x-raytpu-served-by"])
        time.sleep(PROBE_AFTER_S / 2)
    status, _, headers = post(url, body)  # the breaker closed: the TPU replicas again
    assert status == 200 and headers["x-raytpu-served-by"] == "tpu"
    assert router.stats.remote().result(timeout_s=30)["tpu_down"] is False
