"""Goodput logic without Ray: fault specs, the spike / hang / slow-host detectors, tier choice."""

from __future__ import annotations

import math
import os
import threading
import time

import pytest

from workloads.training.checkpoint_tiers import RestorePlan, choose_restore
from workloads.training.config import TrainConfig
from workloads.training.faults import FaultPlan, FaultSpec, check_hosts, parse_fault, parse_faults
from workloads.training.goodput import (
    GoodputConfig,
    SlowHostDetector,
    SpikeDetector,
    Watchdog,
    dump_stacks,
    goodput,
    hang_threshold,
    seconds_left,
)
from workloads.training.worker_loop import data_index


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kill-host@40", FaultSpec("kill-host", 40, -1)),
        ("hang@70:1", FaultSpec("hang", 70, 1)),
        (" spike@0 ", FaultSpec("spike", 0, -1)),
        ("slow-host@20:0", FaultSpec("slow-host", 20, 0)),
        ("preempt@5", FaultSpec("preempt", 5, -1)),
        ("kill-slice@16:1", FaultSpec("kill-slice", 16, 1)),
    ],
    ids=["kill", "hang-host", "spike-spaces", "slow", "preempt", "kill-slice"],
)
def test_fault_spec_parses_and_prints_back(text: str, expected: FaultSpec) -> None:
    assert parse_fault(text) == expected
    assert parse_fault(str(expected)) == expected


@pytest.mark.parametrize(
    "text",
    ["explode@3", "hang", "hang@", "hang@x", "hang@-1", "hang@3:", "hang@3:-2", "@4"],
    ids=[
        "kind",
        "no-step",
        "empty-step",
        "word-step",
        "neg-step",
        "empty-host",
        "neg-host",
        "no-kind",
    ],
)
def test_bad_fault_spec_names_field_value_and_valid_kinds(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_faults(["spike@1", text], field="--inject")
    message = str(caught.value)
    assert message.startswith(f"--inject: {text!r} is not valid; valid: KIND@STEP[:HOST]")
    assert "kill-host, kill-slice, hang, spike, slow-host, preempt" in message


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [("hang@3:2", "names host 2; valid: 0..1"), ("spike@10", "at step 10; valid: 0..9")],
    ids=["host", "step"],
)
def test_fault_outside_the_run_is_refused(spec: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        check_hosts(parse_faults([spec]), process_count=2, steps=10)


def test_plan_targets_one_host_spikes_every_host_and_fires_once() -> None:
    plan = FaultPlan(parse_faults(["kill-host@4", "spike@6:0", "slow-host@2:0"]))
    assert [str(f) for f in plan.at(4, 1, 2)] == ["kill-host@4"]
    assert plan.at(4, 0, 2) == [] and plan.at(2, 0, 2) == []  # a slow host is not a one-shot
    assert [str(f) for f in plan.at(6, 1, 2)] == ["spike@6:0"]
    rest = plan.without(["kill-host@4", "slow-host@2:0"])
    assert rest.to_config() == ["spike@6:0", "slow-host@2:0"], "a slow host stays slow"
    assert FaultPlan.from_config(rest.to_config()) == rest


@pytest.mark.parametrize(
    ("step", "process", "host", "fired_on", "slow"),
    [
        (1, 0, "a/0", {}, False),
        (9, 0, "a/0", {}, True),
        (9, 1, "a/1", {}, False),
        (9, 0, "b/0", {"slow-host@2:0": "a/0"}, False),
        (9, 1, "a/0", {"slow-host@2:0": "a/0"}, True),
    ],
    ids=[
        "before-its-step", "its-process", "other-process", "fired-elsewhere-new-process-0",
        "fired-here-now-process-1",
    ],
)  # fmt: skip
def test_slow_host_is_its_process_until_it_fired_then_its_host(
    step: int, process: int, host: str, fired_on: dict[str, str], slow: bool
) -> None:
    plan = FaultPlan(parse_faults(["slow-host@2:0"]))
    assert bool(plan.slow_at(step, process, 2, host, fired_on)) is slow


def test_injected_spike_batch_is_random_bytes_of_the_same_shape() -> None:
    import numpy as np

    batch = np.zeros((2, 8), np.int32)
    seen: list[str] = []
    spiked = FaultPlan().apply(
        parse_fault("spike@3"), fast_dir=None, announce=lambda f: seen.append(str(f)), batch=batch
    )
    assert seen == ["spike@3"]
    assert spiked.shape == batch.shape and spiked.dtype == batch.dtype
    assert len(set(spiked.ravel().tolist())) > 4


FALLING = [round(3 + 2.6 * math.exp(-i / 5), 3) for i in range(16)]
"""An early loss curve: 5.6 falling to 3.1 over 16 steps (the raw median + 8 x MAD of this
window is 6.6: a corrupt batch at ~5 to 6 went unseen before the trend was taken out)."""


@pytest.mark.parametrize(
    ("losses", "probe", "spike"),
    [
        ([3.0, 2.9, 2.8, 2.85, 2.7, 2.75], 6.0, True),
        ([3.0, 2.9, 2.8, 2.85, 2.7, 2.75], 3.1, False),
        ([3.0, 2.9, 2.8, 2.85, 2.7], 50.0, False),
        ([2.0] * 6, 2.5, True),
        ([2.0] * 6, 2.1, False),
        ([1.95, 2.0, 1.98, 2.01, 1.97, 2.0], 2.15, False),
        (FALLING, 5.0, True),
        (FALLING, 1.04 * (3 + 2.6 * math.exp(-16 / 5)), False),
        ([3.0, 2.8, 2.6, 2.5, 2.45, 2.42, 2.41, 2.40], 2.75, False),
    ],
    ids=[
        "spike", "noise", "too-little-history", "flat-window-spike", "flat-window-wobble",
        "plateau-noise", "early-spike-on-a-falling-loss", "falling-loss-noise",
        "decelerating-loss",
    ],
)  # fmt: skip
def test_spike_is_k_mads_above_the_rolling_median(losses, probe, spike) -> None:
    detector = SpikeDetector(k=8.0, window=16, min_history=6)
    assert [detector.is_spike(x) for x in losses] == [False] * len(losses)
    assert detector.is_spike(probe) is spike
    assert (probe in detector.losses) is not spike


def test_spike_window_rolls_and_keeps_spikes_out() -> None:
    detector = SpikeDetector(k=8.0, window=4, min_history=3, history=[9.0, 9.0, 1.0, 1.1])
    for loss in (1.0, 1.05, 0.95):
        detector.is_spike(loss)
    assert list(detector.losses) == [1.1, 1.0, 1.05, 0.95]
    assert detector.is_spike(9.0)
    assert 9.0 not in detector.losses


@pytest.mark.parametrize(
    ("times", "expected"),
    [([], 30.0), ([0.1, 0.2, 0.3], 30.0), ([4.0, 5.0, 100.0], 50.0)],
    ids=["no-steps-yet", "floor", "k-x-median"],
)
def test_hang_threshold_is_k_median_or_floor(times, expected) -> None:
    assert hang_threshold(times, k=10.0, floor_s=30.0) == expected


def test_watchdog_fires_once_after_the_threshold_and_not_while_beating() -> None:
    fired: list[tuple[int, float, float]] = []
    done = threading.Event()

    def on_hang(step: int, waited: float, limit: float) -> None:
        fired.append((step, waited, limit))
        done.set()

    dog = Watchdog(k=10.0, floor_s=0.4, startup_s=5.0, on_hang=on_hang, poll_s=0.05).start()
    try:
        assert dog.limit_s() == 5.0  # before the first step: the start-up bound
        for step in range(1, 8):
            time.sleep(0.1)
            dog.beat(step, 0.01)
        assert fired == [] and dog.limit_s() == 0.4
        assert done.wait(5.0)
        time.sleep(0.3)
    finally:
        dog.stop()
    assert len(fired) == 1
    step, waited, limit = fired[0]
    assert step == 7 and limit == 0.4 and 0.4 < waited < 2.0


def test_stack_dump_names_every_thread(tmp_path) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="parked", daemon=True)
    thread.start()
    try:
        text = dump_stacks(tmp_path / "logs", "host.txt").read_text()
    finally:
        stop.set()
    assert f"pid {os.getpid()}" in text
    assert "test_stack_dump_names_every_thread" in text
    assert text.count("hread 0x") >= 2  # "Current thread" and the parked one


def test_slow_host_is_flagged_after_n_slow_steps_naming_the_slowest_host() -> None:
    detector = SlowHostDetector(fraction=0.5, steps=3, baseline_steps=4, skip=1)
    normal = [0.01, 0.012]
    assert [detector.observe(s, normal) for s in (2.0, 0.10, 0.11, 0.10, 0.12)] == [None] * 5
    assert detector.baseline == pytest.approx(0.105)
    assert detector.observe(0.7, [0.01, 0.6]) is None
    assert detector.observe(0.15, normal) is None  # a normal step resets the run
    slow = [detector.observe(0.7, [0.01, 0.6]) for _ in range(3)]
    assert slow == [None, None, 1]
    assert [detector.observe(0.7, [0.01, 0.6]) for _ in range(3)] == [None] * 3  # once per host


BASELINE = [0.1, 0.1, 0.1, 0.1]  # steps 1..3 after one compile step: baseline 0.1 s


@pytest.mark.parametrize(
    ("steps", "min_excess_s", "expected"),
    [
        ([(0.7, [0.01, 0.6])] * 3, 0.0, 1),
        ([(0.7, [0.05, 0.06])] * 5, 0.0, None),
        ([(0.7, [0.3, 0.32])] * 5, 0.0, None),
        ([(0.7, [0.6, 0.01]), (0.7, [0.01, 0.6]), (0.7, [0.01, 0.6])], 0.0, None),
        ([(0.25, [0.01, 0.16])] * 3, 0.2, None),
        ([(0.25, [0.01, 0.16])] * 3, 0.1, 1),
        ([(0.7, [0.01, 0.6, 0.02, 0.01])] * 3, 0.0, 1),
        ([(0.7, [0.6])] * 3, 0.0, 0),
        ([(2.5, [0.01, 1.0])] * 3, 0.0, 1),
    ],
    ids=[
        "own-time-explains", "slow-everywhere", "alike-own-times", "culprit-changes",
        "under-min-excess", "over-min-excess", "four-hosts", "one-host", "slow-host-under-load",
    ],
)  # fmt: skip
def test_a_slow_step_names_a_host_only_when_its_own_time_explains_it(
    steps, min_excess_s, expected
) -> None:
    detector = SlowHostDetector(fraction=0.5, steps=3, min_excess_s=min_excess_s)
    hosts = len(steps[0][1])
    assert [detector.observe(s, [0.01] * hosts) for s in BASELINE] == [None] * 4
    flagged = [detector.observe(step_s, host_s) for step_s, host_s in steps]
    assert flagged[-1] == expected and flagged[:-1] == [None] * (len(steps) - 1)


@pytest.mark.parametrize(
    ("fast", "durable", "expected"),
    [
        ([[10, 15], [10, 15]], 10, RestorePlan("fast", 15, 0, (0, 1))),
        ([[10, 15], []], 10, RestorePlan("fast", 15, 0, (0,))),
        ([[], [15]], 10, RestorePlan("fast", 15, 1, (1,))),
        ([[5], [5]], 10, RestorePlan("durable", 10)),
        ([[10], [10]], 10, RestorePlan("durable", 10)),
        ([[], []], None, RestorePlan("none", 0)),
    ],
    ids=["fast-newest", "lost-host-gets-peer", "host0-lost", "durable-newer", "tie", "nothing"],
)
def test_restore_picks_the_newest_complete_step_across_tiers(fast, durable, expected) -> None:
    assert choose_restore(fast, durable) == expected


@pytest.mark.parametrize(
    ("step", "skipped", "expected"),
    [(5, [], 5), (5, [3], 6), (2, [3], 2), (3, [3], 4), (3, [3, 4], 5)],
    ids=["none", "before", "after", "at", "two"],
)
def test_left_out_batches_shift_the_data_order(step, skipped, expected) -> None:
    assert data_index(step, skipped) == expected


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (
            {"spike_policy": "ignore"},
            "spike_policy: 'ignore' is not valid; valid: log, skip, rollback",
        ),
        ({"slow_policy": "evict"}, "slow_policy: 'evict' is not valid; valid: warn, restart"),
        ({"max_restarts": -1}, "max_restarts: -1 is not valid"),
        ({"slow_fraction": 1.5}, "slow_fraction: 1.5 is not valid; valid: 0 < x < 1"),
        ({"faults": ("melt@3",)}, "train.goodput.faults: 'melt@3' is not valid"),
    ],
    ids=["policy", "slow-policy", "restarts", "fraction", "fault"],
)
def test_bad_goodput_config_names_field_and_valid_values(overrides, fragment) -> None:
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        GoodputConfig(**overrides).validate()


def test_train_config_round_trips_through_the_worker_dict() -> None:
    run = TrainConfig(checkpoint_dir="/tmp/x", goodput=GoodputConfig(faults=("hang@3",)))
    assert TrainConfig.from_dict(run.to_dict()) == run


def test_goodput_is_productive_over_wall() -> None:
    assert (goodput(3.0, 4.0), goodput(1.0, 0.0), goodput(5.0, 4.0)) == (0.75, 0.0, 1.0)


@pytest.mark.parametrize(
    ("deadline_ms", "now_s", "expected"),
    [(None, 100.0, 25.0), (0, 100.0, 25.0), (130_000, 100.0, 30.0), (90_000, 100.0, 0.0)],
    ids=["no-deadline", "zero-is-none", "thirty-left", "past"],
)
def test_seconds_left_before_a_preemption(deadline_ms, now_s, expected) -> None:
    assert seconds_left(deadline_ms, 25.0, now_s) == expected


@pytest.mark.parametrize(
    ("inject", "fragment"),
    [
        ("melt@3", "--inject: 'melt@3' is not valid; valid: KIND@STEP[:HOST] with KIND one of"),
        ("hang@3:5", "--inject: 'hang@3:5' names host 5; valid: 0..1"),
        ("spike@99", "--inject: 'spike@99' is at step 99; valid: 0..9"),
    ],
    ids=["kind", "host", "step"],
)
def test_raytpu_train_refuses_a_bad_inject_before_starting_anything(inject, fragment, capsys):
    from raytpu_cli.main import main

    argv = ["train", "--generation", "v6e", "--topology", "2x4"]
    argv += ["--machine-type", "ct6e-standard-4t", "--steps", "10", "--inject", inject]
    assert main([*argv, "--checkpoint-dir", "gs://b/run"]) == 2
    assert fragment in capsys.readouterr().err


def test_watchdog_allows_a_checkpoint_its_own_bound_until_the_next_step() -> None:
    dog = Watchdog(k=10.0, floor_s=2.0, startup_s=5.0, on_hang=lambda *a: None)
    dog.beat(1, 0.1)
    assert dog.limit_s() == 2.0
    dog.expect(300.0)
    assert dog.limit_s() == 300.0
    dog.beat(2, 0.1)
    assert dog.limit_s() == 2.0


def test_goodput_bench_places_each_fault_and_prints_one_row_per_run(capsys) -> None:
    from bench import goodput as bench

    assert [bench.fault_for(s, 7) for s in bench.SCENARIOS] == [
        (),
        ("kill-host@7:1",),
        ("hang@7:1",),
        ("spike@7:1",),
        ("slow-host@7:0",),
        ("kill-slice@7:1",),
        ("preempt@7:1",),
    ]
    event = {"kind": "host_loss", "step": 7, "action": "restart", "duration_s": 30.0}
    run = {"wallS": 90.0, "goodput": 0.25, "finalStep": 20, "paramsDigest": "x"}
    result = {
        "steps": 20, "fastEvery": 5, "checkpointEvery": 10, "hangFloorS": 10.0,
        "preemptGraceS": 25.0, "clusterStartS": 12.0,
        "runs": [
            {**run, "scenario": "none", "faults": [], "steps": 20, "attempts": 1, "events": [],
             "recoveryS": 0.0, "redoneSteps": 0},
            {**run, "scenario": "kill-host", "faults": ["kill-host@7:1"], "steps": 20,
             "attempts": 2, "events": [event], "recoveryS": 30.0, "redoneSteps": 2},
        ],
    }  # fmt: skip
    bench.print_report(result)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["none", "20", "90.0", "s", "25%", "1", "-", "0", "-"] in rows
    kill = ["kill-host@7:1", "20", "90.0", "s", "25%", "2", "30.0", "s", "2", "host_loss@7:"]
    assert [*kill, "restart"] in rows


def test_fast_tier_round_trips_the_state_keeps_the_newest_and_skips_partial_files(tmp_path):
    import jax

    from workloads.model import byte_lm as m
    from workloads.training import checkpoint_tiers as tiers

    cfg = m.ModelConfig(d_model=16, n_heads=2, n_layers=1, d_ff=32, seq_len=8)
    state = m.init_state(cfg, jax.random.PRNGKey(0))
    other = m.init_state(cfg, jax.random.PRNGKey(1))
    for step in (5, 10, 15):
        tiers.save_fast(tmp_path, step, state, {"spike_window": [2.5, 2.4]})
    (tmp_path / ".step_20.npz.partial").write_bytes(b"half")
    assert tiers.fast_steps(tmp_path) == [10, 15]
    plan = tiers.choose_restore([tiers.fast_steps(tmp_path)], 10)
    restored, meta = tiers.restore_fast(tmp_path, plan, other, process_index=0)
    assert m.params_digest(restored.params) == m.params_digest(state.params)
    assert m.params_digest(other.params) != m.params_digest(state.params)
    assert (int(restored.step), meta) == (15, {"spike_window": [2.5, 2.4]})
