"""Benchmarks in tiny configurations: they run and their numbers add up. No timing assertions
(speed is what the benchmarks measure, not what tests check)."""

from __future__ import annotations

import json
import math

import pytest

from bench import _common, iac_scale, matmul


@pytest.mark.parametrize(
    ("samples", "q", "expected"),
    [
        ([3.0], 50, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
        ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
        ([10.0, 0.0], 99, 9.9),
    ],
    ids=["single", "median-even", "p0", "p100", "p99-unsorted"],
)
def test_percentile(samples, q, expected):
    assert _common.percentile(samples, q) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: _common.percentile([], 50), "samples is empty"),
        (lambda: _common.percentile([1.0], 101), "q=101 is not valid; valid: 0..100"),
        (lambda: _common.summarize([]), "samples is empty"),
    ],
    ids=["percentile-empty", "percentile-q", "summarize-empty"],
)
def test_bad_statistics_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_summarize_and_json_round_trip(tmp_path):
    stats = _common.summarize([0.3, 0.1, 0.2])
    assert (stats.n, stats.median, stats.min, stats.max) == (3, 0.2, 0.1, 0.3)
    assert stats.spread == pytest.approx(1.0)
    path = _common.write_results(
        "unit", {"stats": stats, "nan": math.nan, "nested": [{"x": math.inf}]}, tmp_path
    )
    document = json.loads(path.read_text())
    assert document["benchmark"] == "unit"
    assert document["stats"]["median"] == 0.2
    assert document["nan"] is None and document["nested"] == [{"x": None}]
    assert document["machine"]["cores"] >= 1
    assert document["machine"]["versions"]["ray"] == "2.60.0"


@pytest.mark.parametrize("slices", [1, 8, 64], ids=["1-slice", "8-slices", "64-slices"])
def test_synthetic_stack_is_valid(slices):
    from infra.config.stack import parse_config

    config = parse_config(iac_scale.synthetic_config(slices))
    assert len(config.slices) == slices
    assert [c.slice for c in config.ray_clusters] == [s.name for s in config.slices]
    topologies = {s.shape.topology for s in config.slices}
    assert len(topologies) == min(slices, len(iac_scale.SHAPES))


def test_synthetic_stack_rejects_zero_slices():
    with pytest.raises(ValueError, match="slices: 0 is not valid; valid: an integer >= 1"):
        iac_scale.synthetic_config(0)


def test_matmul_probe_tiny():
    result = matmul.measure([32, 64], repeats=2, min_seconds=0.001, report=False)
    assert [r["size"] for r in result["sizes"]] == [32, 64]
    assert result["sizes"][1]["flopsPerCall"] == 2.0 * 64**3
    assert all(r["rate"].n == 2 and r["rate"].min > 0 for r in result["sizes"])
    assert result["peakFlops"] == max(r["rate"].median for r in result["sizes"])


def test_iac_scale_two_tiny_sizes():
    """Both sizes in this process (the benchmark runs each in a fresh one: same function)."""
    result = iac_scale.run([1, 2], repeats=1, measure=iac_scale.measure_size)
    one, two = result["sizes"]
    assert (one["slices"], two["slices"]) == (1, 2)
    assert two["resources"] > one["resources"]
    # Each slice adds one node pool and one RayCluster.
    pools = "gcp:container/nodePool:NodePool"
    rays = "kubernetes:ray.io/v1:RayCluster"
    assert two["resourcesByType"][pools] - one["resourcesByType"][pools] == 1
    assert two["resourcesByType"][rays] - one["resourcesByType"][rays] == 1
    assert one["violations"] == 0 and two["violations"] == 0
    assert one["previewExit"] == 0
    assert two["growth"]["slices"] == 2.0
    assert one["tracemallocProgramPeakBytes"] > 0
    tables = iac_scale.print_report(result)
    assert "raytpu preview" in tables[0]


def test_serving_combine_pools_rounds_and_ratios():
    from bench import serving

    def run(latencies, seconds, batch_sizes=()):
        return {
            "requests": len(latencies),
            "seconds": seconds,
            "latencies": latencies,
            "errors": [],
            "batchSizes": list(batch_sizes),
        }

    modes = {"batched": "HTTP, batching", "unbatched": "HTTP, no batching"}
    rows = [
        serving._combine("in-process, 1 per call", 1, [run([0.1, 0.1], 0.2), run([0.1], 0.1)]),
        serving._combine(modes["batched"], 8, [run([0.4] * 8, 1.0, [8] * 8)]),
        serving._combine(modes["unbatched"], 8, [run([0.8] * 4, 1.0, [1] * 4)]),
    ]
    assert rows[0]["requests"] == 3 and rows[0]["rounds"] == 2
    assert rows[0]["rps"].median == pytest.approx(10.0)
    assert rows[1]["meanBatchSize"] == 8.0
    (ratio,) = serving._ratios(rows, modes)
    assert ratio["concurrency"] == 8
    assert ratio["batchedOverUnbatchedRps"] == pytest.approx(2.0)
    assert ratio["batchedP50OverInProcess"] == pytest.approx(4.0)
    assert ratio["unbatchedRpsOverInProcess"] == pytest.approx(0.4)


def test_reservation_plain_bundles_match_the_slice():
    from bench import reservation

    shape = reservation.bench_shape()
    assert (shape.hosts, shape.chips_per_host) == (2, 4)
    assert reservation.plain_bundles(shape, 3) == [{"TPU": 4.0, "CPU": 1.0}] * 6


@pytest.mark.parametrize(
    ("speedup", "partial", "straddling", "expected"),
    [
        (10.6, 0, 0, ["ok", "ok"]),
        (4.0, 0, 0, ["FAIL", "ok"]),
        (6.0, 2, 0, ["ok", "FAIL"]),
        (6.0, 0, 1, ["ok", "FAIL"]),
    ],
    ids=["both-met", "too-slow", "part-slice-sample", "straddling-grant"],
)
def test_reservation_verdicts(speedup, partial, straddling, expected):
    from bench import reservation

    result = {
        "timeToReady": [
            {"slices": 1, "speedupVsRay": 99.0},
            {"slices": 4, "speedupVsRay": speedup},
        ],
        "contention": {
            "ours": {"monitor": {"partial_slice_samples": partial}, "straddling": straddling}
        },
    }
    lines = reservation.verdicts(result)
    assert [line.split(":")[0] for line in lines] == expected
    assert f"{speedup:.1f}x" in lines[0]


def test_serving_llm_trace_is_seeded_poisson_with_shared_system_prompts():
    from bench import serving_llm

    trace = serving_llm.trace(seed=3, rate=4.0, duration_s=50.0)
    assert trace == serving_llm.trace(seed=3, rate=4.0, duration_s=50.0)
    assert trace != serving_llm.trace(seed=4, rate=4.0, duration_s=50.0)
    assert 140 <= len(trace) <= 260  # about rate x duration = 200 arrivals
    times = [r.at_s for r in trace]
    assert times == sorted(times) and times[-1] < 50.0
    systems = {r.system for r in trace}
    assert systems == {-1, 0, 1, 2}
    shared = [r for r in trace if r.system >= 0]
    assert len(shared) > 0.8 * len(trace)
    heads = {r.system: r.prompt[: serving_llm.SYSTEM_LENGTHS[r.system]] for r in shared}
    assert all(r.prompt.startswith(heads[r.system]) for r in shared)
    assert {r.max_tokens for r in trace} == set(serving_llm.OUTPUT_LENGTHS)
    assert serving_llm._hit_rate(
        {"hits": {"device": 1, "host": 0, "shared": 0}, "misses": 3},
        {"hits": {"device": 7, "host": 1, "shared": 0}, "misses": 5},
    ) == pytest.approx(7 / 9)


CHILDREN = {
    "ok": ("print('{\"a\": 1}')", None),
    "failed": (
        "import sys; print('boom', file=sys.stderr); sys.exit(3)",
        "child x exited 3:\nboom",
    ),
}


@pytest.mark.parametrize(("code", "error"), CHILDREN.values(), ids=CHILDREN)
def test_run_child_returns_stdout_or_names_the_child_with_its_stderr(code, error):
    import sys

    if error is None:
        assert _common.run_child([sys.executable, "-c", code], "child x", 60) == '{"a": 1}\n'
        return
    with pytest.raises(RuntimeError) as caught:
        _common.run_child([sys.executable, "-c", code], "child x", 60)
    assert str(caught.value).strip() == error


def test_import_benchmark_names_what_an_import_loaded():
    from bench import imports

    row = imports.measure("json", repeats=2)
    assert row["module"] == "json" and row["stats"].n == 2 and row["loaded"] == "-"
    with pytest.raises(RuntimeError, match="import no_such_module_here failed"):
        imports.measure("no_such_module_here", repeats=1)
    with pytest.raises(ValueError, match="repeats: 0 is not valid"):
        imports.measure("json", repeats=0)
