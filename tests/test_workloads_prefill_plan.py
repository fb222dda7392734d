"""Prompts of different lengths in one batch: where they go, how they are prefilled, and that the
tokens do not change (:mod:`workloads.serving.engine.prefill_plan`, :meth:`workloads.serving.engine.engine.Engine.generate`)."""

from __future__ import annotations

import pytest

from workloads.serving.engine.prefill_plan import FILLER, PrefillGroup, place, plan_prefill

F = FILLER


@pytest.mark.parametrize(
    ("widths", "size", "devices", "slots"),
    [
        ((16, 16, 16), 4, 1, (0, 1, 2, F)),
        ((16, 64, 32), 4, 1, (1, 2, 0, F)),
        ((16, 16, 256, 256), 8, 4, (2, F, 3, F, 0, F, 1, F)),
        ((16, 256, 16, 256, 16), 8, 4, (1, 4, 3, F, 0, F, 2, F)),
        ((32,), 4, 4, (0, F, F, F)),
    ],
    ids=[
        "one-width-in-order",
        "widest-first",
        "widths-spread-over-devices",
        "five-of-eight",
        "one",
    ],
)
def test_place_spreads_each_width_over_the_devices(widths, size, devices, slots):
    assert place(widths, size, devices) == slots


@pytest.mark.parametrize(
    ("widths", "real", "devices", "buckets", "groups", "joint", "total"),
    [
        ((64,) * 4, (True,) * 4, 1, (1, 2, 4), (), 256, 256),
        (
            (256, 16, 16, 16),
            (True,) * 4,
            1,
            (1, 2, 4),
            (PrefillGroup(256, (0,)), PrefillGroup(16, (1, 2, 3, F))),
            1024,
            320,
        ),
        (
            (256, 16, 16, 16),
            (True, True, False, False),
            1,
            (1, 2, 4),
            (PrefillGroup(256, (0,)), PrefillGroup(16, (1,))),
            1024,
            272,
        ),
        (  # 8 slots on 4 devices: device d holds slots 2d, 2d+1
            (256, 16, 256, 16, 16, 16, 16, 16),
            (True,) * 8,
            4,
            (4, 8),
            (PrefillGroup(256, (0, 2, F, F)), PrefillGroup(16, (1, F, 3, F, 4, 5, 6, 7))),
            2048,
            1024 + 128,
        ),
        (  # both long rows on device 0: their group is all 8 rows, no cheaper than joint
            (256, 256, 16, 16, 16, 16, 16, 16),
            (True,) * 8,
            4,
            (4, 8),
            (),
            2048,
            2048 + 128,
        ),
        (
            (32, 16),
            (True, True),
            1,
            (1, 2),
            (PrefillGroup(32, (0,)), PrefillGroup(16, (1,))),
            64,
            48,
        ),
    ],
    ids=[
        "one-width-joint",
        "long-and-short-grouped",
        "empty-slots-left-out",
        "four-devices",
        "unbalanced-stays-joint",
        "any-saving-groups",
    ],
)
def test_plan_groups_only_where_it_computes_fewer_positions(
    widths, real, devices, buckets, groups, joint, total
):
    plan = plan_prefill(widths, real, devices, buckets)
    assert (plan.groups, plan.joint_tokens, plan.group_tokens) == (groups, joint, total)


def test_local_rows_point_fillers_past_the_end():
    assert PrefillGroup(16, (1, 3, F, 4)).local_rows(per=2) == (1, 1, 2, 0)


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (
            lambda: place((16,), 6, 4),
            r"batch size: 6 is not valid; valid: a positive multiple of the device count \(4\)",
        ),
        (lambda: place((16,) * 3, 2, 1), r"requests: 3 is not valid; valid: 1..2"),
        (
            lambda: plan_prefill((16, 32), (True,), 1, (2,)),
            r"real: 1 is not valid; valid: one flag per slot \(2\)",
        ),
    ],
    ids=["size-not-a-device-multiple", "more-requests-than-slots", "flags-per-slot"],
)
def test_bad_input_names_the_field(call, fragment):
    with pytest.raises(ValueError, match=fragment):
        call()


@pytest.fixture(scope="module")
def tiny():
    import jax

    from workloads.model import byte_lm as m

    cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, context_len=256)
    return cfg, m.init_state(cfg, jax.random.PRNGKey(7)).params


MIXED = ["short", "x" * 150 + " a long prompt", "mid-length prompt, " * 3, "hi"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_mixed_batch_prefills_by_width_and_gives_the_uncached_tokens(tiny, stream):
    from workloads.serving.engine import decode
    from workloads.serving.engine.engine import Engine, Row

    cfg, params = tiny
    rows = [Row(p, n, 0.0) for p, n in zip(MIXED, (6, 4, 5, 3), strict=True)]
    engine = Engine(params, cfg, None, (1, 2, 4), cap=16)
    if stream:
        got = [[] for _ in rows]
        for chunk in engine.stream(rows, seed=1, chunk=2):
            for row, tokens in zip(got, chunk.tokens, strict=True):
                row.extend(tokens)
        timing = chunk.timing
    else:
        got, timing = engine.generate(rows, seed=1)
    expected = decode.generate_tokens_uncached(
        params, cfg, [r.prompt for r in rows], [r.max_new_tokens for r in rows], [0.0] * 4, 1
    )
    assert got == expected
    assert timing.prefill_groups == 3  # widths 16 (two rows), 64 and 256 (one each)
    assert timing.prefill_positions == 256 + 64 + 2 * 16 < 4 * 256
    assert sorted(timing.slots) == [0, 1, 2, 3] and timing.slots[1] == 0  # the longest first


def test_joint_prefill_when_asked_gives_the_same_tokens(tiny):
    from workloads.serving.engine.engine import Engine, Row

    cfg, params = tiny
    rows = [Row(p, 5, 0.0) for p in MIXED]
    buckets = (1, 2, 4)
    grouped, by_width = Engine(params, cfg, None, buckets, cap=8).generate(rows, seed=2)
    joint, at_once = Engine(params, cfg, None, buckets, cap=8, split_prefill=False).generate(
        rows, seed=2
    )
    assert grouped == joint
    assert (by_width.prefill_groups, at_once.prefill_groups) == (3, 1)
    assert at_once.prefill_positions == 4 * 256 > by_width.prefill_positions


def test_warm_up_compiles_everything_a_mixed_batch_needs():
    import jax

    from workloads.model import byte_lm as m
    from workloads.serving.engine import decode
    from workloads.serving.engine.engine import Engine, Row

    cfg = m.ModelConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, context_len=64)
    engine = Engine(m.init_state(cfg, jax.random.PRNGKey(0)).params, cfg, None, (1, 2, 4), cap=8)
    engine.warm_up()
    programs = decode._compiled(cfg, None)
    compiled = {name: fn._cache_size() for name, fn in programs.items()}
    rows = [Row("a" * 40, 4, 0.0), Row("b", 3, 0.0), Row("c" * 20, 4, 0.0)]
    _, timing = engine.generate(rows, seed=0)
    assert timing.prefill_groups == 3
    assert {name: fn._cache_size() for name, fn in programs.items()} == compiled
