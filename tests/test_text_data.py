"""The tokenizer trained on the shipped corpus, and each host reading only its own shard."""

from __future__ import annotations

import numpy as np
import pytest

from raytpu.presets import preset
from workloads.data.corpus import load_corpus
from workloads.data.text_data import HostShard, encode, load_tokenizer, tokenizer_json, windows


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return load_tokenizer(tokenizer_json(corpus, preset("tiny").vocab_size))


def test_tokenizer_has_the_preset_vocab_and_round_trips(tokenizer, corpus):
    assert tokenizer.get_vocab_size() == preset("tiny").vocab_size
    sample = corpus[:2000]
    ids = encode(tokenizer, sample)
    assert tokenizer.decode(ids.tolist()) == sample
    assert ids.max() < preset("tiny").vocab_size
    assert len(ids) < 0.6 * len(sample.encode()), "BPE merges should beat one token per byte"


def test_tokenizer_training_is_deterministic(corpus):
    assert tokenizer_json(corpus, 300) == tokenizer_json(corpus, 300)


def test_too_small_vocab_is_refused(corpus):
    with pytest.raises(ValueError, match=r"vocab_size: 100 is not valid; valid: >= 257"):
        tokenizer_json(corpus, 100)


@pytest.mark.parametrize("hosts", [1, 2, 4], ids=["1-host", "2-hosts", "4-hosts"])
def test_hosts_own_disjoint_shards_that_cover_the_corpus(tokenizer, corpus, hosts):
    all_windows = windows(encode(tokenizer, corpus), 64)
    shards = [HostShard(all_windows, host, hosts, seed=3) for host in range(hosts)]
    owned = [set(s.indices.tolist()) for s in shards]
    assert sum(len(o) for o in owned) == len(all_windows)
    assert set().union(*owned) == set(range(len(all_windows)))
    for shard, mine in zip(shards, owned, strict=True):
        rows = {r.tobytes() for step in range(3) for r in shard.batch(step, 4)}
        allowed = {all_windows[i].tobytes() for i in mine}
        assert rows <= allowed


def test_bad_host_index_is_refused(tokenizer, corpus):
    all_windows = windows(encode(tokenizer, corpus), 64)
    with pytest.raises(ValueError, match=r"host: 2 is not valid; valid: 0..1"):
        HostShard(all_windows, 2, 2)
    with pytest.raises(ValueError, match=r"local_batch: 0 is not valid; valid: 1\.\."):
        HostShard(all_windows, 0, 2).batch(0, 0)


def test_a_step_batch_is_a_function_of_the_step(tokenizer, corpus):
    """Resuming at step s reads exactly what an uninterrupted run reads from step s on, and
    every epoch is a new order of the same windows."""
    all_windows = windows(encode(tokenizer, corpus), 64)
    shard = HostShard(all_windows, 1, 2, seed=7)
    uninterrupted = list(shard.batches(0, 12, 4))
    resumed = list(HostShard(all_windows, 1, 2, seed=7).batches(5, 12, 4))
    assert len(uninterrupted) == 12 and all(b.shape == (4, 65) for b in uninterrupted)
    for got, want in zip(resumed, uninterrupted[5:], strict=True):
        assert np.array_equal(got, want)
    assert np.array_equal(shard.batch(5, 4), uninterrupted[5])
    per_epoch = len(shard.indices)
    flat = np.concatenate([shard.batch(s, 1) for s in range(2 * per_epoch)])
    first, second = flat[:per_epoch], flat[per_epoch:]
    assert sorted(r.tobytes() for r in first) == sorted(r.tobytes() for r in second)
    assert not np.array_equal(first, second), "each epoch is reshuffled"
    assert not np.array_equal(shard.batch(0, 4), HostShard(all_windows, 1, 2, seed=8).batch(0, 4))
