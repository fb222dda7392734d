"""The model-family protocol (workloads.model.family): the lookup, the decode step, and a preset
checkpoint served over the OpenAI completions route of a TextGenerator replica (no Ray: the
replica's own ``respond``, as the HTTP entry point calls it)."""

from __future__ import annotations

import asyncio
import json

import pytest

from raytpu.errors import invalid
from raytpu.presets import MeshConfig, preset

BYTE_MODEL = {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "seq_len": 32}


@pytest.fixture(scope="module")
def tokenizer() -> str:
    from workloads.data.corpus import load_corpus
    from workloads.data.text_data import tokenizer_json

    return tokenizer_json(load_corpus(), preset("tiny").vocab_size)


@pytest.fixture(scope="module")
def families(tokenizer):
    from workloads.model.byte_lm import ModelConfig
    from workloads.model.family import ByteLM, Llama

    return {
        "byte-lm": ByteLM(ModelConfig.from_dict(BYTE_MODEL)),
        "preset": Llama(preset("tiny"), tokenizer=tokenizer),
    }


@pytest.mark.parametrize("which", ["byte-lm", "preset"], ids=["byte-lm", "preset"])
def test_a_family_round_trips_through_its_checkpoint_spec(families, which):
    from workloads.model.family import family_for

    family = families[which]
    spec = json.loads(json.dumps(family.to_dict()))  # what a checkpoint's JSON meta holds
    assert spec["family"] == family.name
    assert family_for(spec) == family


def test_a_spec_without_a_family_is_the_byte_lm_of_older_checkpoints():
    from workloads.model.byte_lm import ModelConfig
    from workloads.model.family import ByteLM, family_for

    assert family_for({"step": 3, "model": BYTE_MODEL}) == ByteLM(ModelConfig(**BYTE_MODEL))


def test_an_unknown_family_is_refused_with_the_valid_ones():
    from workloads.model.family import FAMILIES, family_for

    with pytest.raises(ValueError) as caught:
        family_for({"family": "gpt", "model": {}})
    assert str(caught.value) == invalid("family", "gpt", FAMILIES)
    assert FAMILIES == ("byte-lm", "llama")


def test_the_preset_spec_carries_its_mesh_and_hosts_per_slice(tokenizer):
    from workloads.model.family import family_for

    mesh = {"dcn_data": 2, "ici_data": 1, "ici_fsdp": 4, "ici_tensor": 1}
    spec = {"family": "llama", "model": preset("tiny").to_dict(), "tokenizer": tokenizer}
    family = family_for({**spec, "mesh": mesh, "hosts_per_slice": 2})
    assert (family.mesh_config, family.hosts_per_slice) == (MeshConfig(**mesh), 2)


def test_the_byte_lm_family_steps_exactly_as_byte_lm(families):
    """The worker loop's numerics for the byte LM are byte_lm's own (digests pinned elsewhere)."""
    import jax
    import numpy as np

    from workloads.model import byte_lm as m

    family = families["byte-lm"]
    state = family.init(jax.random.PRNGKey(0))
    assert m.params_digest(state.params) == m.params_digest(
        m.init_state(family.config, jax.random.PRNGKey(0)).params
    )
    batch = family.batches(0, 0, 1).batch(0, 4)
    ours, loss = jax.jit(family.train_step)(state, batch)
    theirs, expected = jax.jit(lambda s, b: m.train_step(family.config, s, b))(state, batch)
    assert float(loss) == float(expected)
    assert m.params_digest(ours.params) == m.params_digest(theirs.params)
    assert np.asarray(batch).shape == (4, family.config.seq_len + 1)


@pytest.mark.parametrize("which", ["byte-lm", "preset"], ids=["byte-lm", "preset"])
def test_the_decode_step_on_right_padded_rows_is_the_last_tokens_logits(families, which):
    import jax
    import numpy as np

    family = families[which]
    params = family.init(jax.random.PRNGKey(1)).params
    ids = family.encode("The quick brown fox")
    width = len(ids) + 5
    padded = np.zeros((1, width), np.int32)
    padded[0, : len(ids)] = ids
    exact = np.asarray([ids], np.int32)
    got = family.next_logits(params, padded, np.asarray([len(ids)], np.int32))
    want = family.next_logits(params, exact, np.asarray([len(ids)], np.int32))
    assert got.shape == (1, family.config.vocab_size if which == "preset" else 256)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=2e-2)


def test_greedy_sampling_is_deterministic_and_temperature_draws(families):
    import jax
    import numpy as np

    from workloads.serving.engine.decode import generate, pick, row_keys
    from workloads.serving.engine.decoders import LlamaDecoder

    family = families["preset"]
    params, decoder = family.init(jax.random.PRNGKey(2)).params, LlamaDecoder(family, 16)
    first = generate(params, decoder, ["Once upon"], [6], [0.0], seed=1)
    assert first == generate(params, decoder, ["Once upon"], [6], [0.0], seed=2)
    assert len(family.encode(first[0])) >= 1
    logits = np.asarray([[0.0, 5.0, 1.0]], np.float32)

    def draw(temperature: float, seed: int) -> int:
        return int(pick(logits, np.asarray([temperature], np.float32), row_keys([seed]))[0])

    assert draw(0.0, 0) == 1
    drawn = {draw(100.0, s) for s in range(40)}
    assert drawn == {0, 1, 2}


@pytest.fixture(scope="module")
def preset_checkpoint(families, tmp_path_factory) -> str:
    """A tiny preset trained 3 steps on its own batches and saved as the worker loop saves."""
    import jax

    from workloads.model.checkpoint import open_checkpoints, save_state

    family = families["preset"]
    state = family.init(jax.random.PRNGKey(0))
    step = jax.jit(family.train_step)
    data = family.batches(0, 0, 1)
    for index in range(3):
        state, _ = step(state, data.batch(index, 4))
    directory = str(tmp_path_factory.mktemp("preset") / "ck")
    manager = open_checkpoints(directory)
    try:
        save_state(manager, 3, state, family)
        manager.wait_until_finished()
    finally:
        manager.close()
    return directory


def _post(replica, path: str, body: dict) -> tuple[int, dict]:
    async def call() -> tuple[int, dict]:
        parts = replica.respond("POST", path, json.dumps(body).encode())
        head = await anext(parts)
        payload = b"".join([part async for part in parts])
        return head.status, json.loads(payload)

    return asyncio.run(call())


def test_a_preset_checkpoint_is_served_over_the_openai_completions_route(preset_checkpoint):
    from workloads.model.checkpoint import restore_params
    from workloads.serving.replica import ServeOptions, TextGenerator

    options = ServeOptions(max_batch_size=2, prefix_cache=False, precompile=False)
    replica = TextGenerator.func_or_class(preset_checkpoint, options)
    body = {"model": options.model_name, "prompt": "The station", "max_tokens": 5}
    status, reply = _post(replica, "/v1/completions", {**body, "temperature": 0})
    assert status == 200, reply
    (choice,) = reply["choices"]
    assert isinstance(choice["text"], str) and choice["text"]
    assert reply["raytpu"]["checkpoint_step"] == 3
    _, again = _post(replica, "/v1/completions", {**body, "temperature": 0})
    assert again["choices"][0]["text"] == choice["text"], "greedy: the same text"
    assert reply["usage"]["completion_tokens"] == 5
    _, family, _ = restore_params(preset_checkpoint)
    assert family.name == "llama" and family.tokenizer, "the checkpoint records its family"
    described = replica.describe()
    assert (described["family"], described["model"], described["prefix"]) == ("llama", "tiny", None)
