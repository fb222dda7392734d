"""Serving without Ray: adaptive batching, the OpenAI-compatible request rules, and the fallback
upstream's bounded retries against a local stub server."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from workloads.serving import openai_api
from workloads.serving.batching import AdaptiveBatcher
from workloads.serving.fallback import FallbackConfig, call_openai, failure_of
from workloads.serving.requests import RequestError


# ------------------------------------------------------------------------------ batching
def _run(batcher_kwargs, arrivals):
    """Submit ``arrivals`` (item, key, delay before it is admitted) and return the batches."""
    batches = []

    async def run(items):
        batches.append(list(items))
        await asyncio.sleep(0.01)
        return [f"done {i}" for i in items]

    async def main():
        batcher = AdaptiveBatcher(run, key=lambda item: item[1], **batcher_kwargs)

        async def one(item, delay):
            with batcher.admit() as ticket:
                await asyncio.sleep(delay)
                return await batcher.submit(item, ticket)

        results = await asyncio.wait_for(
            asyncio.gather(*(one((i, k), d) for i, k, d in arrivals)), timeout=30
        )
        assert results == [f"done {(i, k)}" for i, k, _ in arrivals]

    asyncio.run(main())
    return [[i for i, _ in batch] for batch in batches]


@pytest.mark.parametrize(
    ("kwargs", "arrivals", "expected"),
    [
        ({"max_batch": 8, "max_wait_s": 60.0}, [(0, 16, 0)], [[0]]),
        (
            {"max_batch": 8, "max_wait_s": 60.0},
            [(0, 16, 0), (1, 16, 0.05), (2, 16, 0.1)],
            [[0, 1, 2]],
        ),
        ({"max_batch": 2, "max_wait_s": 60.0}, [(0, 16, 0), (1, 16, 0), (2, 16, 0)], [[0, 1], [2]]),
        (
            {"max_batch": 8, "max_wait_s": 60.0},
            [(0, 16, 0), (1, 512, 0), (2, 16, 0), (3, 512, 0)],
            [[0, 2], [1, 3]],
        ),
        (
            {"max_batch": 8, "max_wait_s": 0.2, "adaptive": False},
            [(0, 16, 0), (1, 16, 0.05)],
            [[0, 1]],
        ),
    ],
    ids=[
        "lone-request-does-not-wait-60s",
        "waits-for-admitted-requests-still-arriving",
        "full-batch-leaves",
        "length-buckets-not-padded-together",
        "fixed-wait-when-not-adaptive",
    ],
)
def test_adaptive_batcher_forms_batches(kwargs, arrivals, expected):
    assert _run(kwargs, arrivals) == expected


def test_a_failed_batch_fails_each_of_its_requests():
    async def run(items):
        raise RuntimeError("model failed")

    async def main():
        batcher = AdaptiveBatcher(run, max_batch=4, max_wait_s=1.0)
        with batcher.admit() as ticket, pytest.raises(RuntimeError, match="model failed"):
            await asyncio.wait_for(batcher.submit(1, ticket), 10)
        assert batcher.depth == 0

    asyncio.run(main())


# ------------------------------------------------------------------------------ OpenAI routes
MODEL = "raytpu-byte-lm"


@pytest.mark.parametrize(
    ("route", "body", "status", "fragment"),
    [
        (openai_api.COMPLETIONS, {"model": "gpt-4", "prompt": "hi"}, 404, "model: 'gpt-4'"),
        (
            openai_api.COMPLETIONS,
            {"model": MODEL, "prompt": ""},
            422,
            "prompt: '' is not valid (empty prompt)",
        ),
        (openai_api.COMPLETIONS, {"model": MODEL, "prompt": "hi", "n": 2}, 422, "n: 2"),
        (
            openai_api.COMPLETIONS,
            {"model": MODEL, "prompt": "hi", "max_tokens": 0},
            422,
            "max_tokens: 0 is not valid; valid: an integer 1..256",
        ),
        (openai_api.COMPLETIONS, {"model": MODEL, "prompt": "hi", "best_of": 3}, 422, "best_of"),
        (
            openai_api.COMPLETIONS,
            {"model": MODEL, "prompt": "hi", "seed": -1},
            422,
            "seed: -1 is not valid; valid: an integer 0..2147483647",
        ),
        (
            openai_api.CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "seed": "7"},
            422,
            "seed: '7' is not valid",
        ),
        (openai_api.COMPLETIONS, {"model": MODEL, "prompt": "hi", "stream": "yes"}, 422, "stream"),
        (openai_api.CHAT, {"model": MODEL, "messages": []}, 422, "messages: [] is not valid"),
        (
            openai_api.CHAT,
            {"model": MODEL, "messages": [{"role": "tool", "content": "x"}]},
            422,
            "messages[0].role: 'tool' is not valid; valid: system, user, assistant",
        ),
        (
            openai_api.CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]},
            422,
            "messages[0].content: character 0",
        ),
    ],
    ids=[
        "unknown-model",
        "empty-prompt",
        "n-2",
        "max-tokens-0",
        "unknown-field",
        "negative-seed",
        "seed-not-int",
        "stream-not-bool",
        "no-messages",
        "bad-role",
        "lone-surrogate",
    ],
)
def test_openai_requests_are_validated_strictly(route, body, status, fragment):
    with pytest.raises(RequestError) as refused:
        openai_api.parse(route, json.dumps(body).encode(), MODEL)
    assert refused.value.status == status
    assert fragment in str(refused.value)


def test_chat_renders_roles_and_stream_events_end_with_done():
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_completion_tokens": 3,
        "stream": True,
    }
    request = openai_api.parse(openai_api.CHAT, json.dumps(body).encode(), MODEL)
    assert request.generate.prompt == "system: Be brief.\nuser: Hi\nassistant:"
    assert request.generate.max_new_tokens == 3 and request.stream
    assert request.generate.seed is None
    seeded = openai_api.parse(openai_api.CHAT, json.dumps({**body, "seed": 7}).encode(), MODEL)
    assert seeded.generate.seed == 7  # the engine's row seed (same seed, same sample)
    completion = openai_api.Completion(request)
    euro = list("€".encode())  # 3 bytes split over two events arrive as one character
    first = completion.event(euro[:2], last=False).decode()
    second = completion.event(euro[2:], last=True).decode()
    assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"] == {
        "content": "",
        "role": "assistant",
    }
    events = [line.removeprefix("data: ") for line in second.split("\n\n") if line]
    assert json.loads(events[0])["choices"][0]["delta"] == {"content": "€"}
    assert events[1] == "[DONE]"


# ------------------------------------------------------------------------------ fallback upstream
@pytest.fixture
def upstream():
    """A local OpenAI-compatible stub: answers the statuses queued in ``answers`` in turn."""
    seen: list[dict] = []
    answers: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers["Content-Length"])
            seen.append(
                {"auth": self.headers.get("Authorization"), **json.loads(self.rfile.read(length))}
            )
            status = answers.pop(0) if answers else 200
            payload = {"choices": [{"text": "stub says hi", "index": 0}]}
            body = json.dumps(payload if status == 200 else {"error": "slow down"}).encode()
            self.send_response(status)
            if status == 429:
                self.send_header("Retry-After", "1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen, answers
    finally:
        server.shutdown()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    ("answers", "status", "attempts", "sleeps"),
    [
        ([], 200, 1, []),
        ([429, 503], 200, 3, [0.25, 0.5]),
        ([429, 429, 429, 429], 429, 3, [0.25, 0.5]),
        ([400], 400, 1, []),
    ],
    ids=["ok", "recovers-on-third", "429-every-time", "client-error-not-retried"],
)
def test_upstream_retries_are_bounded(upstream, monkeypatch, answers, status, attempts, sleeps):
    url, seen, queued = upstream
    queued.extend(answers)
    monkeypatch.setenv("RAYTPU_TEST_FALLBACK_KEY", "sk-test")
    config = FallbackConfig("openai", url, "upstream-model", "RAYTPU_TEST_FALLBACK_KEY", 5.0)
    slept: list[float] = []
    reply = call_openai(config, "/v1/completions", {"prompt": "hi", "model": "x"}, slept.append)
    assert (reply.status, reply.attempts, slept) == (status, attempts, sleeps)
    assert len(seen) == attempts
    assert seen[0]["model"] == "upstream-model" and seen[0]["auth"] == "Bearer sk-test"
    if status == 429:
        assert reply.retry_after == 1
        assert "RTPU-U01" in str(failure_of(reply))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"kind": "gpu"}, "fallback.kind: 'gpu' is not valid; valid: openai, deployment"),
        ({"kind": "openai", "url": "ftp://x"}, "fallback.url: 'ftp://x' is not valid"),
        ({"kind": "deployment", "max_attempts": 0}, "fallback.max_attempts: 0 is not valid"),
    ],
    ids=["kind", "url", "attempts"],
)
def test_fallback_config_names_the_bad_field(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace("'", "'")):
        FallbackConfig(**kwargs)


# ------------------------------------------------------------------------------ router, no Ray
class _Stream:
    """What ``handle.options(stream=True).respond.remote(...)`` returns: async parts."""

    def __init__(self, parts, failure=None):
        self._parts, self._failure, self.cancelled = list(parts), failure, False

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._failure is not None:
            raise self._failure
        if not self._parts:
            raise StopAsyncIteration
        return self._parts.pop(0)

    def cancel(self):
        self.cancelled = True


class _Handle:
    """A deployment handle whose ``respond`` answers ``reply()`` (parts or an exception)."""

    def __init__(self, reply):
        self.reply, self.calls = reply, 0

    def options(self, **_):
        return self

    @property
    def respond(self):
        return self

    def remote(self, *_):
        self.calls += 1
        outcome = self.reply()
        return _Stream([], outcome) if isinstance(outcome, BaseException) else _Stream(outcome)


class _Request:
    def __init__(self, path, body):
        self.method, self._body = "POST", json.dumps(body).encode()
        self.url = type("Url", (), {"path": path})()
        self.headers = {"content-length": str(len(self._body))}

    async def stream(self):
        yield self._body


@pytest.mark.parametrize(
    ("failure", "opens"),
    [("unavailable", True), ("actor-died", True), ("back-pressure", False)],
    ids=["unavailable-opens-the-breaker", "dead-replica-opens-it", "busy-does-not"],
)
def test_router_falls_back_while_the_tpu_deployment_is_unavailable_and_returns_after(
    upstream, failure, opens
):
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    from workloads.serving.http import Head
    from workloads.serving.router import Router

    errors = {
        "unavailable": lambda: DeploymentUnavailableError("tg"),
        "actor-died": lambda: RayActorError(),
        "back-pressure": lambda: BackPressureError(num_queued_requests=1, max_queued_requests=1),
    }
    url, seen, _ = upstream
    state = {"up": True}
    ok = Head(200, headers={"X-Raytpu-Served-By": "tpu"})

    def tpu_reply():
        return [ok, b'{"completion": "tpu"}'] if state["up"] else errors[failure]()

    tpu = _Handle(tpu_reply)
    fallback = FallbackConfig(
        "openai", url, "upstream-model", timeout_s=5, backoff_s=0, probe_after_s=0.5
    )
    router = Router.func_or_class(tpu, fallback, None, MODEL, 5.0)
    body = {"prompt": "hello", "max_new_tokens": 4}

    def ask():
        response = asyncio.run(router(_Request("/generate", body)))
        return response.status_code, response.headers["x-raytpu-served-by"], response.body

    assert ask() == (200, "tpu", b'{"completion": "tpu"}') and not seen
    state["up"] = False
    status, served_by, raw = ask()
    assert (status, served_by) == (200, "fallback-openai")
    assert json.loads(raw)["completion"] == "stub says hi" and len(seen) == 1
    assert router.stats()["tpu_down"] is opens
    state["up"] = True
    # Open: straight to the fallback, the TPU deployment not asked; busy: asked again at once.
    assert ask()[1] == ("fallback-openai" if opens else "tpu")
    assert tpu.calls == (2 if opens else 3)
    time.sleep(0.6)  # past probe_after_s: the next request probes, and the breaker closes
    assert ask()[:2] == (200, "tpu") and router.stats()["tpu_down"] is False
    assert router.stats()["breaker_opened"] == int(opens)


def test_sharded_prefill_and_decode_run_without_collectives(tmp_path):
    """On a 4-device mesh: XLA's CPU runtime deadlocks on collectives when programs overlap on
    2 cores, and a collective per decode step would be slow anywhere. The width groups' takes and
    puts stay on each row's device too, and a grouped batch gives the one-device tokens."""
    import subprocess
    import sys

    script = tmp_path / "hlo.py"
    script.write_text(
        """
import jax, jax.numpy as jnp, numpy as np
from workloads.serving.engine import decode as d
from workloads.model import byte_lm as m
cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, context_len=64)
mesh = m.local_mesh()
params = jax.device_put(m.init_state(cfg, jax.random.PRNGKey(0)).params, m.replicated(mesh))
place = lambda x: m.place_batch(x, mesh)
kv = d.new_cache(cfg, 4, mesh)
fns = d._compiled(cfg, mesh)
rows = place(np.ones(4, np.int32))
texts = [
    fns["prefill"].lower(params, kv, place(np.ones((4, 16), np.int32)), rows * 0, rows),
    fns["decode"].lower(params, kv, place(np.zeros((4, 256), np.float32)), rows,
                        place(np.zeros(4, np.float32)), place(d.row_keys(range(4))), jnp.int32(2), cap=8),
]
local = place(np.array([0, 2, 1, 2], np.int32))  # a width group: rows 0 and 1 of two devices
texts += [
    fns["take_rows"].lower(kv, local),
    fns["put_rows"].lower((kv, rows), (kv, rows), local),
]
for lowered in texts:
    hlo = lowered.compile().as_text()
    assert not [op for op in ("all-gather", "all-reduce", "collective-permute") if op in hlo]
# Widths 64, 32 and 16, grouped on the mesh: the tokens of one device's joint prefill.
from workloads.serving.engine.engine import Engine, Row
batch = [Row(p, 4, 0.0) for p in ("a", "b" * 40, "c" * 20, "d", "e" * 40, "f")]
on_mesh, timing = Engine(params, cfg, mesh, (4, 8), cap=8).generate(batch, seed=0)
alone = Engine(params, cfg, None, (8,), cap=8, split_prefill=False).generate(batch, seed=0)[0]
assert timing.prefill_groups == 3 and on_mesh == alone, (timing, on_mesh, alone)
print("ok")
"""
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    env["JAX_PLATFORMS"] = "cpu"
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
