"""The KV-cached serving engine on a Llama read from a Hugging Face folder
(:class:`workloads.serving.engine.decoders.LlamaDecoder`): transformers' greedy tokens through
prefill, decode and the prefix cache; sampling equal to the cache-free reference; streamed text
equal to the whole text; what a Serve replica loads from the folder."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
import pytest
from hf_reference import Reference, make_reference

from workloads.data.corpus import load_corpus
from workloads.model import hf_llama
from workloads.model.family import Llama
from workloads.serving.engine import decode
from workloads.serving.engine.decoders import LlamaDecoder, TextStream
from workloads.serving.engine.engine import Engine, Row
from workloads.serving.engine.prefix_cache import BLOCK_TOKENS, PrefixCache

pytestmark = pytest.mark.timeout(300)
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Reference:
    return make_reference(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="module")
def decoder(reference) -> LlamaDecoder:
    """The folder's model in fp32 (parity), its whole 64-position context."""
    family = Llama(reference.preset, reference.tokenizer)
    return LlamaDecoder(family, reference.preset.seq_len)


@pytest.fixture(scope="module")
def params(reference) -> Any:
    return hf_llama.load_params(str(reference.folder), reference.preset)


@pytest.fixture(scope="module")
def prompts(decoder) -> list[tuple[int, ...]]:
    """Two prompts that share their first two cache blocks and differ after."""
    ids = decoder.encode(load_corpus()[:2000]).tolist()
    shared = ids[: 2 * BLOCK_TOKENS]
    return [tuple(shared + ids[40:45]), tuple(shared + ids[60:70])]


def test_the_engine_with_its_prefix_cache_decodes_transformers_greedy_tokens(
    reference, decoder, params, prompts
):
    cache = PrefixCache(decoder, "tiny-llama", device_blocks=8, host_blocks=8)
    engine = Engine(params, decoder, None, (1, 2), prefix=cache, cap=16)
    rows = [Row(p, NEW_TOKENS, 0.0) for p in prompts]
    theirs = [reference.generate(list(p), NEW_TOKENS) for p in prompts]
    first, cold = engine.generate(rows, seed=0)
    again, warm = engine.generate(rows, seed=5)
    assert first == theirs and again == theirs
    assert all(len(set(t)) > 1 for t in theirs), "a constant continuation tells nothing"
    assert cold.cached_tokens == 0
    assert [hit.start for hit in warm.hits] == [2 * BLOCK_TOKENS, 2 * BLOCK_TOKENS]
    assert warm.prefill_tokens == sum(len(p) for p in prompts) - 4 * BLOCK_TOKENS


def test_sampling_through_the_cache_equals_the_cache_free_reference(decoder, params, prompts):
    asked = dict(max_new_tokens=[6, NEW_TOKENS], temperatures=[0.9, 1.3], seed=4)
    cached = decode.generate_tokens(params, decoder, list(prompts), **asked)
    uncached = decode.generate_tokens_uncached(params, decoder, list(prompts), **asked)
    assert cached == uncached
    assert [len(row) for row in cached] == [6, NEW_TOKENS]


def test_streamed_chunks_decode_to_the_whole_text(reference, decoder, params, prompts):
    engine = Engine(params, decoder, None, (1,), cap=16)
    (whole,), _ = engine.generate([Row(prompts[0], NEW_TOKENS, 0.0)], seed=0)
    stream, sent = TextStream(decoder, NEW_TOKENS), []
    for chunk in engine.stream([Row(prompts[0], NEW_TOKENS, 0.0)], seed=0, chunk=4):
        sent += stream.push(chunk.tokens[0])
    assert bytes(sent).decode("utf-8") == decoder.decode(whole)


@dataclasses.dataclass(frozen=True)
class _Utf8Tokens:
    """A decoder whose tokens are bytes but that is not the byte LM's: it takes the BPE path."""

    def decode(self, tokens: list[int]) -> str:
        return bytes(tokens).decode("utf-8", errors="replace")


@pytest.mark.parametrize(
    ("chunks", "sent"),
    [
        ([[104, 0xE2], [0x82, 0xAC, 105]], [[104], [0xE2, 0x82, 0xAC, 105]]),
        ([[104], [0xE2]], [[104], [0xE2]]),
        ([[0xE2, 0x82], [0xAC]], [[], [0xE2, 0x82, 0xAC]]),
    ],
    ids=["char-split-over-chunks", "the-last-token-flushes", "held-back-then-whole"],
)
def test_a_character_split_over_chunks_is_held_back_until_whole(chunks, sent):
    stream = TextStream(_Utf8Tokens(), sum(len(c) for c in chunks))
    pushed = [stream.push(chunk) for chunk in chunks]
    expected = [bytes(s).decode("utf-8", errors="replace").encode() for s in sent]
    assert [bytes(p) for p in pushed] == expected


@dataclasses.dataclass
class _LeadingSpaceTokens:
    """Tokens that are words, each decoded with a leading space but the row's first, as a
    SentencePiece tokenizer does (``▁word``); records how many tokens each decode was given."""

    words: tuple[str, ...]
    asked: list[int] = dataclasses.field(default_factory=list)

    def decode(self, tokens: list[int]) -> str:
        self.asked.append(len(tokens))
        return " ".join(self.words[t] for t in tokens)


def test_a_long_stream_decodes_bounded_windows_to_the_whole_text():
    words = tuple(f"w{i}é" for i in range(40))
    decoder, chunk = _LeadingSpaceTokens(words), 4
    tokens = [i % len(words) for i in range(400)]
    stream, sent = TextStream(decoder, len(tokens)), []
    for start in range(0, len(tokens), chunk):
        sent += stream.push(tokens[start : start + chunk])
    assert bytes(sent).decode("utf-8") == " ".join(words[t] for t in tokens)
    assert max(decoder.asked) <= 2 * chunk, "each push decodes its window, not the whole row"


@pytest.mark.parametrize("context_len", [1, 65], ids=["too-short", "past-seq-len"])
def test_a_context_the_model_cannot_hold_is_refused(decoder, context_len):
    with pytest.raises(ValueError, match=rf"context_len.*{context_len}.*2\.\.64"):
        LlamaDecoder(decoder.family, context_len)


def test_a_replica_serves_a_folder_through_the_engine_and_its_prefix_cache(reference, prompts):
    from workloads.model import byte_lm
    from workloads.serving.replica import ServeOptions
    from workloads.serving.replica_model import load_replica_model

    options = ServeOptions(precompile=False, shared_prefix=False)
    mesh = byte_lm.local_mesh()
    loaded = load_replica_model(str(reference.folder), mesh, (1, 2), options, lambda *_: None, 16)
    engine = loaded.engine
    assert isinstance(engine.cfg, LlamaDecoder) and engine.prefix is not None
    assert (loaded.family.name, loaded.step, engine.cfg.context_len) == ("llama", 0, 64)
    rows = [Row(p, NEW_TOKENS, 0.0) for p in prompts]
    served, _ = engine.generate(rows, seed=0)
    again, warm = engine.generate(rows, seed=1)
    reference_tokens = decode.generate_tokens_uncached(
        engine.params, engine.cfg, list(prompts), [NEW_TOKENS] * 2, [0.0, 0.0]
    )
    assert served == again == reference_tokens
    assert min(hit.start for hit in warm.hits) == 2 * BLOCK_TOKENS
    assert np.asarray(jax.tree.leaves(engine.params)[0]).dtype == np.float32
