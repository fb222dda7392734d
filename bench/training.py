"""Training overhead: the same Flax train step bare vs through JaxTrainer on a simulated slice.

Both sides run :func:`timed_steps`, which calls :func:`workloads.model.byte_lm.train_step` the way
:mod:`workloads.training.driver` does (a 1-D ``data`` mesh over every device, replicated state, the global
batch assembled with ``jax.make_array_from_process_local_data``, the loss read back every step):

- **bare**: one process with ``--xla_force_host_platform_device_count=<chips>``: every device of
  the slice in a single JAX program, no Ray;
- **JaxTrainer**: a local slice cluster (:mod:`workloads.sim.local_cluster`) of one v6e 2x4 slice on
  4-chip hosts (2 hosts x 4 chips = the same 8 devices), Ray Train's ``JaxTrainer`` with
  ``use_tpu=True`` and one worker per host; ``jax.distributed`` joins the 2 worker processes into
  one mesh, gradients are all-reduced across them, and each step reports to Ray Train.

Steady state = the median step after ``--warmup`` steps (compilation included in the first).
Tokens per second = global batch x sequence length / step time. MFU = model FLOPs per step
(``6 x matmul params x tokens + 12 x layers x d_model x seq_len x tokens``, the PaLM convention;
XLA's own count of the compiled step is reported next to it) / step time / this CPU's peak
float32 matmul rate in JAX (:mod:`bench.matmul`: one device and all devices, the best median),
measured in the same run right before and after the bare steps (the better of the two).

    python -m bench.training [--steps 15] [--warmup 3] [--global-batch 32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import _common
from raytpu import catalog
from workloads import ray_compat

CHILD_TIMEOUT_S = 600.0
FIT_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class StepBench:
    """What both sides run: model overrides, global batch, warm-up and timed steps."""

    global_batch: int = 32
    warmup: int = 3
    steps: int = 15
    seed: int = 0
    model: dict[str, Any] = field(default_factory=dict)
    """Overrides of :class:`workloads.model.byte_lm.ModelConfig` (default: the workload's defaults)."""


def bench_shape() -> catalog.SliceShape:
    return catalog.shape("v6e", "2x4", machine_type="ct6e-standard-4t")


def timed_steps(bench: dict[str, Any], report: Callable[[dict], None] | None = None) -> dict:
    """Run warm-up + timed train steps on every device of this JAX world; returns timings.

    ``report`` (Ray Train's ``ray.train.report`` under JaxTrainer) is called after every step,
    as the workload does.
    """
    from functools import partial

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from workloads.data.corpus import load_corpus
    from workloads.model import byte_lm as m

    run = StepBench(**bench)
    cfg = m.ModelConfig.from_dict(run.model)
    devices = jax.devices()
    if run.global_batch % len(devices):
        raise ValueError(
            f"global_batch: {run.global_batch!r} is not valid; valid: a multiple of the "
            f"{len(devices)} devices"
        )
    mesh = Mesh(np.array(devices), ("data",))
    data_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())
    local_batch = run.global_batch // jax.process_count()
    corpus = m.encode(load_corpus())
    state = jax.jit(partial(m.init_state, cfg), out_shardings=replicated)(
        jax.random.PRNGKey(run.seed)
    )
    step_fn = jax.jit(
        partial(m.train_step, cfg),
        in_shardings=(replicated, data_sharding),
        out_shardings=(replicated, replicated),
        donate_argnums=0,
    )
    # Phases: warm-up (reported if ``report``), quiet (never reported), reported (if ``report``).
    phases = [("warmup", run.warmup, report), ("quiet", run.steps, None)]
    if report is not None:
        phases.append(("reported", run.steps, report))
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in phases}
    report_seconds: list[float] = []
    losses: list[float] = []
    step = 0
    for name, count, reporter in phases:
        for _ in range(count):
            began = time.perf_counter()
            local = m.sample_batch(
                corpus, local_batch, cfg.seq_len, seed=(run.seed, step, jax.process_index())
            )
            batch = jax.make_array_from_process_local_data(data_sharding, local)
            state, loss = step_fn(state, batch)
            loss_value = float(loss.addressable_data(0))
            computed = time.perf_counter()
            if reporter is not None:
                reporter({"step": step + 1, "loss": loss_value})
                if name == "reported":
                    report_seconds.append(time.perf_counter() - computed)
            seconds[name].append(time.perf_counter() - began)
            losses.append(loss_value)
            step += 1
    return {
        "processCount": jax.process_count(),
        "deviceCount": jax.device_count(),
        "localDeviceCount": jax.local_device_count(),
        "compileStepS": seconds["warmup"][0],
        "stepS": seconds["quiet"],
        "reportedStepS": seconds.get("reported", []),
        "reportS": report_seconds,
        "firstLoss": losses[0],
        "lastLoss": losses[-1],
        "model": cfg.to_dict(),
    }


def model_flops(bench: dict[str, Any]) -> dict[str, float]:
    """Model FLOPs of one train step, analytic (PaLM) and as XLA counts the unsharded step."""
    from functools import partial

    import jax
    import jax.numpy as jnp

    from workloads.model import byte_lm as m

    run = StepBench(**bench)
    cfg = m.ModelConfig.from_dict(run.model)
    state = jax.eval_shape(partial(m.init_state, cfg), jax.random.PRNGKey(0))
    leaves = jax.tree_util.tree_leaves_with_path(state.params)
    total = sum(int(x.size) for _, x in leaves)
    embed = sum(
        int(x.size)
        for path, x in leaves
        if "Embed" in jax.tree_util.keystr(path) or jax.tree_util.keystr(path).endswith("['pos']")
    )
    tokens = run.global_batch * cfg.seq_len
    analytic = (
        6.0 * (total - embed) * tokens + 12.0 * cfg.n_layers * cfg.d_model * cfg.seq_len * tokens
    )
    batch = jax.ShapeDtypeStruct((run.global_batch, cfg.seq_len + 1), jnp.int32)
    compiled = jax.jit(partial(m.train_step, cfg)).lower(state, batch).compile()
    cost = compiled.cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per computation
        cost = cost[0]
    return {
        "params": float(total),
        "matmulParams": float(total - embed),
        "tokensPerStep": float(tokens),
        "analyticFlopsPerStep": analytic,
        "xlaFlopsPerStep": float(cost.get("flops", float("nan"))),
    }


# -- bare: a fresh process with <chips> host devices -----------------------------------------


def bare_child(bench: dict[str, Any], matmul_repeats: int) -> dict[str, Any]:
    """In a process started with the XLA device-count flag: matmul peak, FLOPs, timed steps.

    The matmul probe runs right before and right after the steps; the peak is the better of the
    two (the machine is shared: a probe that ran during someone else's burst understates it).
    """
    import jax

    from bench import matmul

    _common.progress(f"bare: {jax.device_count()} devices in one process; matmul probe")
    before = matmul.measure(repeats=matmul_repeats, report=True)
    flops = model_flops(bench)
    _common.progress("bare: timed train steps")
    steps = timed_steps(bench)
    _common.progress("bare: matmul probe again")
    after = matmul.measure(repeats=matmul_repeats, report=True)
    best = max(before, after, key=lambda r: r["peakFlops"])
    return {
        "matmul": best,
        "matmulPeaks": [before["peakFlops"], after["peakFlops"]],
        "flops": flops,
        "steps": steps,
    }


def run_bare(bench: StepBench, devices: int, matmul_repeats: int) -> dict[str, Any]:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    command = [
        sys.executable,
        "-m",
        "bench.training",
        "--child-bare",
        json.dumps(asdict(bench)),
        "--matmul-repeats",
        str(matmul_repeats),
    ]
    done = subprocess.run(
        command,
        cwd=_common.REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bare training child exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1], object_hook=_stats_hook)


def _stats_hook(obj: dict) -> Any:
    if set(obj) >= {"n", "median", "min", "max", "p50", "p99", "mean"}:
        return _common.Stats(
            **{k: obj[k] for k in ("n", "median", "min", "max", "p50", "p99", "mean")}
        )
    return obj


# -- through JaxTrainer on the simulated slice ---------------------------------------------------


def trainer_loop(config: dict[str, Any]) -> None:
    """JaxTrainer's ``train_loop_per_worker``: :func:`timed_steps` with a report every step."""
    import ray.train

    result = timed_steps(config["bench"], report=ray.train.report)
    # Ray Train v2 keeps only metrics attached to a checkpoint in ``Result.metrics``; rank 0's
    # metrics are the ones attached.
    with tempfile.TemporaryDirectory(prefix="bench-report-") as directory:
        checkpoint = None
        if ray.train.get_context().get_world_rank() == 0:
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        ray.train.report({"step": -1, "bench": result}, checkpoint=checkpoint)


def run_trainer(
    bench: StepBench, shape: catalog.SliceShape, health_check_s: float | None = None
) -> dict[str, Any]:
    import ray.train
    from ray.train.v2.jax import JaxTrainer

    from bench.reservation import slice_config
    from workloads.sim.local_cluster import LocalSliceCluster

    _common.progress(f"JaxTrainer: starting local slice cluster of one {shape.name}")
    overrides = {ray_compat.WORKER_GROUP_START_TIMEOUT_ENV: str(FIT_START_TIMEOUT_S)}
    if health_check_s is not None:
        overrides[ray_compat.HEALTH_CHECK_INTERVAL_ENV] = str(health_check_s)
    previous = {key: os.environ.get(key) for key in overrides}
    os.environ.update(overrides)
    try:
        with (
            LocalSliceCluster([slice_config(shape, 1)]) as cluster,
            tempfile.TemporaryDirectory(prefix="bench-train-") as storage,
        ):
            _common.progress(f"cluster up in {cluster.start_seconds:.1f} s; fit()")
            trainer = JaxTrainer(
                train_loop_per_worker=trainer_loop,
                train_loop_config={"bench": asdict(bench)},
                scaling_config=ray_compat.tpu_scaling_config(
                    shape.hosts,
                    shape.topology,
                    shape.ray_accelerator_type,
                    {"TPU": shape.chips_per_host},
                ),
                run_config=ray.train.RunConfig(
                    name="bench-training",
                    storage_path=storage,
                    failure_config=ray_compat.no_retries_failure_config(),
                ),
            )
            began = time.perf_counter()
            result = trainer.fit()
            fit_s = time.perf_counter() - began
            metrics = result.metrics or {}
            if "bench" not in metrics:
                raise RuntimeError(f"JaxTrainer ended without the bench report: {metrics}")
            return {
                **metrics["bench"],
                "fitS": fit_s,
                "clusterStartS": cluster.start_seconds,
            }
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# -- the run ------------------------------------------------------------------------------------


def run(
    bench: StepBench, matmul_repeats: int, health_check_s: float | None = None
) -> dict[str, Any]:
    shape = bench_shape()
    if bench.global_batch % shape.chips:
        raise ValueError(
            f"--global-batch: {bench.global_batch!r} is not valid; valid: a multiple of the "
            f"{shape.chips} chips of {shape.name}"
        )
    _common.progress("bare JAX process (matmul probe, FLOPs, steps)")
    bare = run_bare(bench, shape.chips, matmul_repeats)
    trainer = run_trainer(bench, shape, health_check_s)
    peak = bare["matmul"]["peakFlops"]
    flops = bare["flops"]
    sides = {}
    reported = {**trainer, "stepS": trainer["reportedStepS"]}
    for name, side in (
        ("bare", bare["steps"]),
        ("jaxtrainer", trainer),
        ("jaxtrainerReported", reported),
    ):
        stats = _common.summarize(side["stepS"])
        sides[name] = {
            "processes": side["processCount"],
            "devices": side["deviceCount"],
            "step": stats,
            "compileStepS": side["compileStepS"],
            "tokensPerS": flops["tokensPerStep"] / stats.median,
            "mfu": flops["analyticFlopsPerStep"] / stats.median / peak,
            "mfuXla": flops["xlaFlopsPerStep"] / stats.median / peak,
            "firstLoss": side["firstLoss"],
            "lastLoss": side["lastLoss"],
        }
    return {
        "shape": shape.to_dict(),
        "bench": asdict(bench),
        "model": bare["steps"]["model"],
        "flops": flops,
        "matmul": bare["matmul"],
        "peakFlops": peak,
        "matmulPeaks": bare["matmulPeaks"],
        "sides": sides,
        "ratio": _common.ratio(sides["jaxtrainer"]["step"].median, sides["bare"]["step"].median),
        "ratioReported": _common.ratio(
            sides["jaxtrainerReported"]["step"].median, sides["bare"]["step"].median
        ),
        "reportS": _common.summarize(trainer["reportS"]),
        "fitS": trainer["fitS"],
        "healthCheckIntervalS": health_check_s,
        "clusterStartS": trainer["clusterStartS"],
    }


SIDE_NAMES = {
    "bare": "bare JAX, 1 process",
    "jaxtrainer": "JaxTrainer, 1 host per worker",
    "jaxtrainerReported": "JaxTrainer + ray.train.report each step",
}


def print_report(result: dict[str, Any]) -> list[str]:
    m = result["model"]
    f = result["flops"]
    rows = [
        (
            SIDE_NAMES[name],
            s["processes"],
            s["devices"],
            _common.fmt_stats(s["step"]),
            s["step"].n,
            f"{s['tokensPerS']:,.0f}",
            f"{100 * s['mfu']:.1f}%",
            f"{100 * s['mfuXla']:.1f}%",
            _common.fmt_seconds(s["compileStepS"]),
        )
        for name, s in result["sides"].items()
    ]
    title = (
        f"Train step, {m['n_layers']} layers d_model {m['d_model']} seq {m['seq_len']}, "
        f"{f['params'] / 1e6:.2f} M params, global batch {result['bench']['global_batch']}; "
        f"peak matmul {result['peakFlops'] / 1e9:.1f} GFLOP/s; step time JaxTrainer/bare "
        f"{_common.fmt_ratio(result['ratio'])}, with a report every step "
        f"{_common.fmt_ratio(result['ratioReported'])}"
    )
    table = _common.print_table(
        title,
        (
            "side",
            "processes",
            "devices",
            "step median [min..max]",
            "steps",
            "tokens/s",
            "MFU (6N+attn)",
            "MFU (XLA flops)",
            "first step (compile)",
        ),
        rows,
    )
    print(
        f"FLOPs per step: {f['analyticFlopsPerStep'] / 1e9:.2f} G analytic, "
        f"{f['xlaFlopsPerStep'] / 1e9:.2f} G by XLA; matmul peak before/after the bare steps "
        + "/".join(f"{p / 1e9:.1f}" for p in result["matmulPeaks"])
        + f" GFLOP/s; ray.train.report "
        f"{_common.fmt_stats(result['reportS'])}; JaxTrainer fit() {result['fitS']:.1f} s, "
        f"cluster start {result['clusterStartS']:.1f} s; {ray_compat.HEALTH_CHECK_INTERVAL_ENV}="
        f"{result['healthCheckIntervalS'] or 'default (2 s)'}. {_common.NO_ACCELERATOR}."
    )
    return [table]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.training", description=__doc__)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per phase")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (1st compiles)")
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument(
        "--model", default="{}", help="ModelConfig overrides as JSON, e.g. '{\"d_model\": 256}'"
    )
    parser.add_argument("--matmul-repeats", type=int, default=3)
    parser.add_argument(
        "--health-check-interval",
        type=float,
        help=f"set {ray_compat.HEALTH_CHECK_INTERVAL_ENV} for the trainer (default: Ray's, 2 s)",
    )
    parser.add_argument("--child-bare", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_bare is not None:
        print(
            json.dumps(
                _common.jsonable(bare_child(json.loads(args.child_bare), args.matmul_repeats))
            )
        )
        return 0
    for name in ("steps", "warmup"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)!r} is not valid; valid: 1 or more")
    bench = StepBench(
        global_batch=args.global_batch,
        warmup=args.warmup,
        steps=args.steps,
        model=json.loads(args.model),
    )
    result = run(bench, args.matmul_repeats, args.health_check_interval)
    print_report(result)
    print(_common.machine_line())
    _common.write_results("training", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
