"""Goodput under injected faults: one training run per fault class, and one without.

Each run trains the byte-level LM (:mod:`workloads.training.driver`) on a local slice cluster of one v6e 2x4
slice on two 4-chip hosts, checkpoints on the GCS emulator (durable tier, every
``--checkpoint-every`` steps) and each host's disk (fast tier, every ``--fast-every``), with one
fault from :mod:`workloads.training.faults` at ``--at`` (on host 1, a slow host on host 0). The
``preempt`` run is longer (``--preempt-steps``): host 1's node is drained for preemption with
``--preempt-grace`` seconds to its deadline, as GKE's SIGTERM does, and must still be training
when the deadline comes; the simulated node pool then kills the host and starts a new one.

- **goodput** = productive step time (the steps in the final state, each counted once) / the
  run's wall time (capacity checks, worker start-up, compilation, restores and redone steps are
  the rest);
- **recovery** = seconds from a failed attempt until the next attempt finished a step (the
  :class:`workloads.training.goodput.GoodputEvent` duration), for the classes that restart;
- **redone steps** = steps trained more than once (:attr:`TrainResult.redone_steps`: back to
  the restored checkpoint after a restart, a rollback, or what a preempted host trained after its
  emergency checkpoint).

    python -m bench.goodput [--steps 30] [--at 17] [--fast-every 5] [--checkpoint-every 20]
                            [--preempt-steps 200] [--preempt-grace 25]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import _common
from raytpu import catalog

BUCKET = "raytpu-bench-goodput"
MODEL = {"d_model": 64, "n_heads": 2, "n_layers": 2, "d_ff": 128, "seq_len": 64}
SCENARIOS = ("none", "kill-host", "hang", "spike", "slow-host", "kill-slice", "preempt")
"""``kill-slice`` and ``preempt`` last: their hosts are replaced, which the runs after them wait
for."""


def fault_for(scenario: str, at: int) -> tuple[str, ...]:
    if scenario == "none":
        return ()
    if scenario == "slow-host":
        return (f"slow-host@{at}:0",)
    return (f"{scenario}@{at}:1",)


def run(
    steps: int,
    at: int,
    fast_every: int,
    checkpoint_every: int,
    hang_floor_s: float,
    preempt_steps: int,
    preempt_grace_s: float,
) -> dict[str, Any]:
    from raytpu_cli.common import SliceChoice
    from workloads.sim.gcs_emulator import GcsEmulator
    from workloads.sim.local_cluster import LocalSliceCluster
    from workloads.training.config import TrainConfig
    from workloads.training.driver import run_training
    from workloads.training.goodput import GoodputConfig

    shape = catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")
    rows = []
    with (
        tempfile.TemporaryDirectory() as logs,
        GcsEmulator((BUCKET,)) as gcs,
        LocalSliceCluster([SliceChoice("train", shape, 1)], env=gcs.env) as cluster,
    ):
        for scenario in SCENARIOS:
            _common.progress(f"goodput run: {scenario}")
            preempt = scenario == "preempt"
            config = TrainConfig(
                checkpoint_dir=f"gs://{BUCKET}/{scenario}",
                steps=preempt_steps if preempt else steps,
                global_batch=16,
                checkpoint_every=checkpoint_every,
                log_every=10,
                model=MODEL,
                goodput=GoodputConfig(
                    fast_every=fast_every,
                    hang_floor_s=hang_floor_s,
                    preempt_grace_s=preempt_grace_s,
                    faults=fault_for(scenario, at),
                    log_dir=str(Path(logs) / scenario),
                ),
            )
            result = run_training(shape, config, name=f"goodput-{scenario}")
            restarts = [e for e in result.events if e.duration_s > 0]
            rows.append(
                {
                    "scenario": scenario,
                    "faults": list(config.goodput.faults),
                    "steps": config.steps,
                    "wallS": result.wall_s,
                    "goodput": result.goodput,
                    "attempts": result.attempts,
                    "restores": [list(r) for r in result.restores],
                    "events": [asdict(e) for e in result.events],
                    "recoveryS": sum(e.duration_s for e in restarts),
                    "redoneSteps": result.redone_steps,
                    "finalStep": result.final_step,
                    "paramsDigest": result.params_digest,
                }
            )
        start_s = cluster.start_seconds
    return {
        "shape": shape.to_dict(),
        "steps": steps,
        "at": at,
        "fastEvery": fast_every,
        "checkpointEvery": checkpoint_every,
        "hangFloorS": hang_floor_s,
        "preemptGraceS": preempt_grace_s,
        "model": MODEL,
        "clusterStartS": start_s,
        "runs": rows,
    }


def print_report(result: dict[str, Any]) -> list[str]:
    rows = [
        (
            r["scenario"] if not r["faults"] else ", ".join(r["faults"]),
            r["steps"],
            f"{r['wallS']:.1f} s",
            f"{r['goodput']:.0%}",
            r["attempts"],
            f"{r['recoveryS']:.1f} s" if r["recoveryS"] else "-",
            r["redoneSteps"],
            ", ".join(f"{e['kind']}@{e['step']}: {e['action']}" for e in r["events"]) or "-",
        )
        for r in result["runs"]
    ]
    table = _common.print_table(
        f"Goodput on v6e 2x4 (2 simulated hosts), fast tier every {result['fastEvery']}, "
        f"durable every {result['checkpointEvery']}, hang floor {result['hangFloorS']:.0f} s, "
        f"preemption grace {result['preemptGraceS']:.0f} s",
        ("fault", "steps", "wall", "goodput", "attempts", "recovery", "redone steps", "events"),
        rows,
    )
    print(
        f"Cluster start {result['clusterStartS']:.1f} s (not in any run). {_common.NO_ACCELERATOR}."
    )
    return [table]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.goodput", description=__doc__)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--at", type=int, default=17, help="the step each fault hits")
    parser.add_argument("--fast-every", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--hang-floor", type=float, default=10.0, help="seconds")
    parser.add_argument(
        "--preempt-steps", type=int, default=200, help="long enough to outlast the grace period"
    )
    parser.add_argument("--preempt-grace", type=float, default=25.0, help="seconds")
    args = parser.parse_args(argv)
    if not 0 < args.at < args.steps:
        parser.error(f"--at: {args.at!r} is not valid; valid: 1..{args.steps - 1}")
    if args.preempt_steps <= args.at:
        parser.error(
            f"--preempt-steps: {args.preempt_steps!r} is not valid; valid: > --at ({args.at})"
        )
    result = run(
        args.steps,
        args.at,
        args.fast_every,
        args.checkpoint_every,
        args.hang_floor,
        args.preempt_steps,
        args.preempt_grace,
    )
    print_report(result)
    print(_common.machine_line())
    _common.write_results("goodput", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
