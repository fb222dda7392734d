"""IaC scale: the offline Pulumi program and the policy run for stacks of 1, 8 and 64 slices.

Each stack is built from a synthetic ``config:`` mapping with :func:`infra.config.parse_config`
(``--sizes`` slices, each with its own RayCluster; shapes cycle through v6e 2x4 on 4-chip hosts,
v6e 4x4, v5p 2x2x4 and single-host v6e 2x2). For each size a fresh subprocess (so peak memory is
that size's alone) measures, in this order:

- **raytpu preview**: the whole command (``raytpu preview bench --json`` on the stack written as
  ``Pulumi.bench.yaml`` in a temporary folder: YAML, config, program, policy pack, report);
- **program**: :func:`infra.offline.run_program` alone (the Pulumi program under mocks), median
  and range over repeats;
- **policy**: :func:`policies.evaluation.evaluate` over the declared resources, the same;
- **peak memory**: Python allocations during one program + policy run (``tracemalloc``, a
  separate pass since tracing slows everything down) and the process's maximum resident set
  (``ru_maxrss``) before and after.

Growth ratios are each size over the smallest size, measured in the same run.

    python -m bench.iac_scale [--sizes 1 8 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import _common

SHAPES: tuple[dict[str, Any], ...] = (
    {"generation": "v6e", "topology": "2x4", "machineType": "ct6e-standard-4t"},
    {"generation": "v6e", "topology": "4x4"},
    {"generation": "v5p", "topology": "2x2x4"},
    {"generation": "v6e", "topology": "2x2"},
)
PROVISIONING = ("spot", "on-demand", "reservation")
REGION = "us-east5"
ZONES = ("us-east5-a", "us-east5-b")
CHILD_TIMEOUT_S = 600.0


def synthetic_config(slices: int) -> dict[str, Any]:
    """The ``config:`` mapping of a stack with ``slices`` slices, one RayCluster on each."""
    if slices < 1:
        raise ValueError(f"slices: {slices!r} is not valid; valid: an integer >= 1")
    raw_slices = []
    clusters = []
    for index in range(slices):
        provisioning = PROVISIONING[index % len(PROVISIONING)]
        item: dict[str, Any] = {
            "name": f"s{index}",
            **SHAPES[index % len(SHAPES)],
            "zone": ZONES[index % len(ZONES)],
            "count": 1,
            "provisioning": provisioning,
        }
        if provisioning == "reservation":
            item["reservation"] = f"bench-reservation-{index}"
        raw_slices.append(item)
        clusters.append({"name": f"rc{index}", "slice": f"s{index}", "replicas": 1})
    return {
        "gcp:project": "ray-tpu-bench",
        "gcp:region": REGION,
        "ray-tpu:rayVersion": "2.60.0",
        "ray-tpu:cluster": {
            "name": "ray-tpu-bench",
            "location": REGION,
            "cpuPool": {
                "name": "cpu",
                "machineType": "n2-standard-8",
                "minNodes": 1,
                "maxNodes": 3,
                "zones": list(ZONES),
            },
        },
        "ray-tpu:slices": raw_slices,
        "ray-tpu:rayClusters": clusters,
    }


def _maxrss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB


def time_preview(slices: int, repeats: int) -> tuple[list[float], int]:
    """``raytpu preview bench --json`` end to end (YAML, config, program, policy, report)."""
    import yaml

    from raytpu_cli.main import main as raytpu_main

    seconds = []
    code = -1
    with tempfile.TemporaryDirectory(prefix="bench-iac-") as directory:
        stack_file = Path(directory) / "Pulumi.bench.yaml"
        stack_file.write_text(yaml.safe_dump({"config": synthetic_config(slices)}))
        for _ in range(repeats):
            sink = io.StringIO()
            began = time.perf_counter()
            with contextlib.redirect_stdout(sink):
                code = raytpu_main(["preview", "bench", "--json", "--project-dir", directory])
            seconds.append(time.perf_counter() - began)
            if code not in (0, 1):
                raise RuntimeError(f"raytpu preview exited {code}: {sink.getvalue()[-2000:]}")
    return seconds, code


def measure_size(slices: int, repeats: int) -> dict[str, Any]:
    """All measurements for one size, in this process (run it in a fresh one)."""
    from infra.config.stack import parse_config
    from infra.offline import run_program
    from policies.evaluation import evaluate

    rss_after_import = _maxrss_bytes()
    began = time.perf_counter()
    config = parse_config(synthetic_config(slices))
    parse_s = time.perf_counter() - began

    program_s: list[float] = []
    policy_s: list[float] = []
    resources: list[Any] = []
    violations: list[Any] = []
    for _ in range(repeats + 1):  # the first run is a warm-up (imports, caches)
        began = time.perf_counter()
        resources, _outputs = run_program(config, stack="bench")
        program_s.append(time.perf_counter() - began)
        began = time.perf_counter()
        violations = evaluate(resources)
        policy_s.append(time.perf_counter() - began)
    cold_program_s, cold_policy_s = program_s.pop(0), policy_s.pop(0)
    preview_s, preview_exit = time_preview(slices, repeats)
    rss_after_runs = _maxrss_bytes()

    tracemalloc.start()
    resources, _outputs = run_program(config, stack="bench")
    _, program_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    evaluate(resources)
    _, policy_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    by_type: dict[str, int] = {}
    for item in resources:
        by_type[item.type] = by_type.get(item.type, 0) + 1
    return {
        "slices": slices,
        "resources": len(resources),
        "resourcesByType": by_type,
        "violations": len(violations),
        "violationMessages": [v.message for v in violations[:5]],
        "parseS": parse_s,
        "programS": _common.summarize(program_s).to_dict(),
        "policyS": _common.summarize(policy_s).to_dict(),
        "previewS": _common.summarize(preview_s).to_dict(),
        "previewExit": preview_exit,
        "coldProgramS": cold_program_s,
        "coldPolicyS": cold_policy_s,
        "tracemallocProgramPeakBytes": program_peak,
        "tracemallocPolicyPeakBytes": policy_peak,
        "maxrssAfterImportBytes": rss_after_import,
        "maxrssAfterRunsBytes": rss_after_runs,
    }


def run_child(slices: int, repeats: int, timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """:func:`measure_size` in a fresh interpreter; its JSON comes back on stdout."""
    command = [
        sys.executable,
        "-m",
        "bench.iac_scale",
        "--child",
        str(slices),
        "--repeats",
        str(repeats),
    ]
    stdout = _common.run_child(command, f"iac_scale child for {slices} slices", timeout_s)
    return json.loads(stdout.strip().splitlines()[-1])


def run(
    sizes: Sequence[int],
    repeats: int,
    measure: Callable[[int, int], dict[str, Any]] = run_child,
) -> dict[str, Any]:
    """Every size through ``measure`` (default: a fresh process each), then growth ratios."""
    rows = []
    for slices in sizes:
        _common.progress(f"{slices} slice(s): {repeats} repeats + 1 warm-up")
        rows.append(measure(slices, repeats))
    base = rows[0]
    for row in rows:
        row["growth"] = {
            "slices": row["slices"] / base["slices"],
            "resources": row["resources"] / base["resources"],
            "preview": _common.ratio(row["previewS"]["median"], base["previewS"]["median"]),
            "program": _common.ratio(row["programS"]["median"], base["programS"]["median"]),
            "policy": _common.ratio(row["policyS"]["median"], base["policyS"]["median"]),
            "tracemallocPeak": _common.ratio(
                row["tracemallocProgramPeakBytes"], base["tracemallocProgramPeakBytes"]
            ),
        }
        row["policyPerResourceS"] = row["policyS"]["median"] / max(1, row["resources"])
        row["programPerResourceS"] = row["programS"]["median"] / max(1, row["resources"])
    return {"repeats": repeats, "sizes": rows}


def _fmt(stats: dict[str, float]) -> str:
    return (
        f"{_common.fmt_seconds(stats['median'])} "
        f"[{_common.fmt_seconds(stats['min'])}..{_common.fmt_seconds(stats['max'])}]"
    )


def print_report(result: dict[str, Any]) -> list[str]:
    rows = [
        (
            r["slices"],
            r["resources"],
            _fmt(r["previewS"]),
            _fmt(r["programS"]),
            _fmt(r["policyS"]),
            _common.fmt_seconds(r["policyPerResourceS"]),
            _common.fmt_bytes(r["tracemallocProgramPeakBytes"]),
            _common.fmt_bytes(r["tracemallocPolicyPeakBytes"]),
            _common.fmt_bytes(r["maxrssAfterRunsBytes"]),
            r["violations"],
        )
        for r in result["sizes"]
    ]
    first = _common.print_table(
        f"IaC scale: offline Pulumi program and policy pack (median [min..max] of "
        f"{result['repeats']} repeats, one fresh process per size)",
        (
            "slices",
            "resources",
            "raytpu preview",
            "program",
            "policy",
            "policy/resource",
            "peak alloc program",
            "peak alloc policy",
            "max RSS",
            "violations",
        ),
        rows,
    )
    growth = [
        (
            r["slices"],
            _common.fmt_ratio(r["growth"]["slices"]),
            _common.fmt_ratio(r["growth"]["resources"]),
            _common.fmt_ratio(r["growth"]["preview"]),
            _common.fmt_ratio(r["growth"]["program"]),
            _common.fmt_ratio(r["growth"]["policy"]),
            _common.fmt_ratio(r["growth"]["tracemallocPeak"]),
        )
        for r in result["sizes"]
    ]
    second = _common.print_table(
        f"Growth relative to {result['sizes'][0]['slices']} slice(s)",
        (
            "slices",
            "slices x",
            "resources x",
            "preview time x",
            "program time x",
            "policy time x",
            "peak alloc x",
        ),
        growth,
    )
    return [first, second]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.iac_scale", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats!r} is not valid; valid: 1 or more")
    if args.child is not None:
        print(json.dumps(measure_size(args.child, args.repeats)))
        return 0
    result = run(args.sizes, args.repeats)
    print_report(result)
    print(_common.machine_line())
    _common.write_results("iac_scale", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
