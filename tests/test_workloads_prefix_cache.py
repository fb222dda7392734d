"""The prefix cache without Ray: block hashes, LRU tiers, and that a hit replaces prefill exactly
(same tokens as no cache) while computing fewer prompt tokens."""

from __future__ import annotations

import pytest

from workloads.serving.engine.prefix_cache import LRUTier, block_hashes

SYSTEM = "You are a helpful assistant. Answer briefly and politely. "  # 58 bytes: 3 full blocks


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (list(range(48)), list(range(48)), 3),
        (list(range(48)), [*range(16), 99, *range(17, 48)], 1),
        (list(range(47)), list(range(48)), 2),
        ([1] * 15, [1] * 15, 0),
    ],
    ids=["equal", "differ-in-block-2", "partial-block-not-hashed", "shorter-than-a-block"],
)
def test_block_hashes_chain_over_the_prefix(a, b, shared):
    ha, hb = block_hashes("m", a), block_hashes("m", b)
    assert len(ha) == len(a) // 16
    common = next(
        (i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y), min(len(ha), len(hb))
    )
    assert common == shared


def test_block_hashes_depend_on_the_model_and_the_limit():
    ids = list(range(64))
    assert block_hashes("m1", ids)[0] != block_hashes("m2", ids)[0]
    assert block_hashes("m", ids, limit=63) == block_hashes("m", ids)[:3]
    with pytest.raises(ValueError, match=r"block: 0 is not valid; valid: an integer >= 1"):
        block_hashes("m", ids, block=0)


def test_lru_tier_evicts_the_least_recently_used():
    tier = LRUTier("device", 2)
    assert tier.put("a", 1) == [] and tier.put("b", 2) == []
    assert tier.get("a") == 1  # "b" is now the oldest
    assert tier.put("c", 3) == [("b", 2)]
    assert "b" not in tier and len(tier) == 2 and tier.get("b") is None
    with pytest.raises(ValueError, match=r"host capacity: -1 is not valid"):
        LRUTier("host", -1)


@pytest.fixture(scope="module")
def tiny():
    import jax

    from workloads.model import byte_lm as m

    cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, context_len=128)
    return cfg, m.init_state(cfg, jax.random.PRNGKey(4)).params


def _engine(tiny, device_blocks: int):
    from workloads.serving.engine.engine import Engine
    from workloads.serving.engine.prefix_cache import PrefixCache

    cfg, params = tiny
    cache = PrefixCache(cfg, "tiny", device_blocks=device_blocks, host_blocks=8)
    return Engine(params, cfg, None, (1, 2), prefix=cache, cap=16), cache


@pytest.mark.parametrize(
    ("device_blocks", "tier"), [(8, "device"), (1, "host")], ids=["device-tier", "spilled-to-host"]
)
def test_a_shared_system_prompt_skips_its_prefill_and_changes_no_token(tiny, device_blocks, tier):
    from workloads.serving.engine import decode
    from workloads.serving.engine.engine import Row

    cfg, params = tiny
    engine, cache = _engine(tiny, device_blocks)
    first = [Row(SYSTEM + "What is a TPU?", 6, 0.0)]
    second = [Row(SYSTEM + "Where is the station?", 6, 0.7)]
    _, cold = engine.generate(first, seed=1)
    assert cold.cached_tokens == 0 and cache.counts.misses == 4  # 71 bytes: 4 full blocks
    tokens, warm = engine.generate(second, seed=2)
    assert warm.cached_tokens == 48 and [hit.tier for hit in warm.hits] == [tier]
    assert cache.counts.hits[tier] >= 1 and cache.counts.skipped_tokens == 48
    assert warm.prefill_tokens == len(second[0].prompt) - 48
    # The work skipped: the prefill program is a quarter as wide (length buckets 128 -> 32).
    assert (cold.prefill_positions, warm.prefill_positions) == (128, 32)
    uncached = decode.generate_tokens_uncached(params, cfg, [second[0].prompt], [6], [0.7], 2)
    assert tokens == uncached


def test_a_seeded_row_gives_the_same_tokens_in_any_batch_and_slot(tiny):
    """The OpenAI API's ``seed``: a row's key is its own, not its batch's (so a batch job's
    sampled row equals a Serve request with the seed it wrote)."""
    from workloads.serving.engine.engine import Engine, Row

    cfg, params = tiny
    engine = Engine(params, cfg, None, (1, 2, 4), cap=16)
    row = Row("The old teacher said", 12, 1.0, seed=7)
    alone, _ = engine.generate([row], seed=0)
    others = [Row("Somewhere else entirely", 12, 1.0), Row("x", 3, 0.5)]
    (_, _, in_batch), _ = engine.generate([*others, row], seed=99)
    assert in_batch == alone[0]
    reseeded, _ = engine.generate([Row(row.prompt, 12, 1.0, seed=8)], seed=0)
    assert reseeded != alone  # the seed, not the prompt alone, picks the sample
    # Rows without a seed of their own: the batch's seed and their place decide.
    first, _ = engine.generate(others, seed=3)
    assert engine.generate(others, seed=3)[0] == first != engine.generate(others, seed=4)[0]


def test_a_lookup_never_sees_half_of_a_publish(monkeypatch):
    """The directory actor serves calls concurrently: a lookup during a publish sees none of its
    blocks or all of them, never a prefix cut short."""
    import threading
    import time

    import ray

    from workloads.serving.engine.prefix_cache import PrefixDirectory

    def slow_put(value):
        time.sleep(0.005)  # the object store under load
        return value

    monkeypatch.setattr(ray, "put", slow_put)
    keys = block_hashes("m", list(range(16 * 43)))
    directory = PrefixDirectory(capacity=1000)
    publisher = threading.Thread(target=directory.publish, args=({k: k for k in keys},))
    publisher.start()
    seen = set()
    while publisher.is_alive():
        seen.add(len(directory.lookup([keys])[0]))
    publisher.join()
    seen.add(len(directory.lookup([keys])[0]))
    assert seen <= {0, 43} and 43 in seen, seen
