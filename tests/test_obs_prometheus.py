"""A real Prometheus (Debian's ``prometheus``) scrapes the simulated slice cluster while a short
training run that loses a host, a forced NaN run, a mis-sized reservation, a burst of serving
requests and two requests whose fallback upstream fails (429, no answer) happen;
then every PromQL expression of the dashboards and of the alert rules' signals must return data
with the expected labels, through Prometheus' HTTP API.

One cluster (the dev stack's slices: v6e 2x4 on two 4-chip hosts, v6e 2x2 serving host), one
Prometheus scraping every Ray node's metrics export port each second. Both stop in finalizers.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from obs_tools import binary
from upstream_stub import upstream_stub

from infra.config.stack import load_stack
from infra.manifests import dashboards, monitoring_rules
from raytpu import errors, processes
from raytpu import metric_names as mn
from raytpu_cli import failure
from raytpu_cli.common import post_json
from workloads.sim.gcs_emulator import GcsEmulator
from workloads.sim.local_cluster import LocalSliceCluster, free_port

pytestmark = [pytest.mark.ray, pytest.mark.long, pytest.mark.timeout(600)]

READY_TIMEOUT_S = 30.0
DATA_TIMEOUT_S = 120.0


def _get(url: str, timeout_s: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return json.loads(response.read().decode())


class Prometheus:
    def __init__(self, targets: list[str], workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": "ray", "static_configs": [{"targets": targets}]},
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (workdir / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"prometheus exited with {self.process.returncode}")
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"prometheus not ready after {READY_TIMEOUT_S:.0f} s")

    def query(self, expr: str) -> list[dict[str, Any]]:
        reply = _get(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert reply["status"] == "success", reply
        return reply["data"]["result"]

    def stop(self) -> None:
        processes.stop([self.process], timeout_s=10, group=True)
        self.log.close()


class Poller:
    """Evaluates every expression every 2 s while the workloads run and keeps the first non-empty
    answer of each: a worker's series go stale once its process ends, so an instant query after
    the run would miss them."""

    def __init__(self, prometheus: Prometheus, exprs: dict[str, str]) -> None:
        self.prometheus = prometheus
        self.exprs = dict(exprs)
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, expr in self.exprs.items():
                if key in self.results:
                    continue
                try:
                    found = self.prometheus.query(expr)
                except (OSError, AssertionError) as error:
                    self.errors.append(f"{key}: {error}")
                    continue
                if found:
                    self.results[key] = found
            self._stop.wait(2)

    def missing(self) -> list[str]:
        return [key for key in self.exprs if key not in self.results]

    def finish(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.missing() and time.monotonic() < deadline:
            time.sleep(1)
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster up, Prometheus scraping it, the workloads run; yields what they produced."""
    import ray
    from ray import serve

    from workloads.serving import app as serving
    from workloads.serving.fallback import FallbackConfig
    from workloads.serving.replica import ServeOptions
    from workloads.slices.reservation import SliceReservationError, reserve_slices
    from workloads.training.config import TrainConfig
    from workloads.training.driver import TrainingError, run_training
    from workloads.training.goodput import GoodputConfig

    workdir = tmp_path_factory.mktemp("obs")
    stack = load_stack("dev")
    train, serve_slice = stack.slice("train"), stack.slice("serve")
    produced: dict[str, Any] = {}
    with (
        upstream_stub(hang_s=5.0) as upstream,
        GcsEmulator(("obs",)) as gcs,
        LocalSliceCluster(stack.slices, env=gcs.env) as cluster,
    ):
        assert cluster.address
        targets = [f"127.0.0.1:{n['MetricsExportPort']}" for n in ray.nodes() if n["Alive"]]
        prometheus = Prometheus(targets, workdir)
        # The driver's series (reservations) carry the slice config name; the cluster's nodes
        # were started before this, so replicas keep labelling from their TPU_NAME.
        os.environ[mn.SLICE_ENV] = "train"
        try:
            prometheus.wait_ready()
            exprs = {where: expr for where, expr, _ in _signals()}
            exprs.update({f"errors/{k}": v[0] for k, v in ERROR_SERIES.items()})
            poller = Poller(prometheus, exprs)
            produced["poller"] = poller
            try:
                with reserve_slices(train.shape, tpu_per_bundle=8, timeout_s=3):
                    pytest.fail("a bundle of TPU 8 fits no 4-chip host")
            except SliceReservationError as error:
                produced["missized"] = error
            # Host 1 of the slice dies at step 3: one host_loss fault event and its recovery.
            goodput = GoodputConfig(
                fast_every=2,
                startup_timeout_s=120.0,
                faults=("kill-host@3:1",),
                log_dir=str(workdir / "runs"),
            )
            config = TrainConfig(
                checkpoint_dir="gs://obs/ck",
                steps=6,
                global_batch=8,
                checkpoint_every=3,
                log_every=3,
                goodput=goodput,
            )
            produced["trained"] = run_training(train.shape, config)
            nan_config = TrainConfig(
                checkpoint_dir="gs://obs/ck-nan",
                steps=6,
                global_batch=8,
                checkpoint_every=6,
                log_every=6,
                model={"learning_rate": 1e30, "warmup_steps": 1},
            )
            try:
                run_training(train.shape, nan_config, name="raytpu-nan")
            except TrainingError as error:
                produced["nan"] = error
            # The router in front of the replica: the upstream fallback fails (429, then no
            # answer) once the replica drains, so both classes reach the metrics for real.
            fallback = FallbackConfig("openai", upstream.url, "stub", timeout_s=1.0, max_attempts=1)
            handle = serving.deploy(
                serving.build_app(
                    config.checkpoint_dir,
                    serve_slice.shape,
                    options=ServeOptions(precompile=False),  # short prompts only here
                    fallback=fallback,
                    slice_name=serve_slice.name,
                    tpu_timeout_s=120.0,  # the first requests compile
                ),
                port=free_port(),
                timeout_s=180,
            )
            try:
                # One shared 32-byte head (two prefix-cache blocks): misses, then hits.
                prompts = [f"You are the ray-tpu docs helper. The TPU {i}" for i in range(8)]
                with ThreadPoolExecutor(4) as pool:
                    produced["replies"] = list(
                        pool.map(
                            lambda p: post_json(handle.url, {"prompt": p, "max_new_tokens": 4}),
                            prompts,
                        )
                    )
                produced["bad"] = post_json(handle.url, None, raw=b"{nope")
                replica = serve.get_deployment_handle("TextGenerator", handle.name)
                assert replica.drain.remote(True).result(timeout_s=30)
                upstream.mode = "429"
                produced["limited"] = post_json(handle.url, {"prompt": "busy?"})
                upstream.mode = "hang"
                produced["unanswered"] = post_json(handle.url, {"prompt": "anyone?"})
                poller.finish(DATA_TIMEOUT_S)
                yield produced
            finally:
                serving.shutdown()
        finally:
            os.environ.pop(mn.SLICE_ENV, None)
            if "poller" in produced:
                produced["poller"].stop()
            prometheus.stop()


def _signals() -> list[tuple[str, str, tuple[str, ...]]]:
    found = [
        (where, dashboards.concrete(q.expr), q.labels) for where, q in dashboards.all_queries()
    ]
    found += [(f"alert/{a.name}", a.signal, mn.BASE_LABELS) for a in monitoring_rules.ALERTS]
    return found


def test_the_workloads_ran(scraped: dict[str, Any]) -> None:
    assert errors.classify(scraped["missized"]) == errors.MISSIZED_REQUEST
    trained = scraped["trained"]
    assert trained.final_step == 6
    assert [(e.kind, e.step) for e in trained.events] == [("host_loss", 3)], trained.events
    assert trained.restores == (("none", 0), ("fast", 2))
    assert errors.classify(scraped["nan"]) == errors.RUNTIME_NAN, str(scraped["nan"])
    assert [r.status for r in scraped["replies"]] == [200] * 8
    assert scraped["bad"].status == 400
    limited, unanswered = scraped["limited"], scraped["unanswered"]
    assert limited.status == 429 and "RTPU-U01" in str(limited.body), limited
    assert unanswered.status == 504 and "RTPU-N01" in str(unanswered.body), unanswered


def test_every_dashboard_and_alert_expression_returns_labelled_data(
    scraped: dict[str, Any],
) -> None:
    poller: Poller = scraped["poller"]
    signals = _signals()
    missing = [f"{where}: {expr}" for where, expr, _ in signals if where not in poller.results]
    assert not missing, "no data for: " + "; ".join(missing) + f" (errors: {poller.errors[:3]})"
    for where, _, labels in signals:
        for series in poller.results[where]:
            assert set(labels) <= set(series["metric"]), (where, series["metric"])
            assert series["metric"]["stack"] == "local", where
            assert series["metric"]["generation"] == "v6e", where
            assert series["metric"]["slice"] in ("train", "serve"), (where, series["metric"])


ERROR_SERIES = {
    # (series selector, who produced it, the exit code the CLI gives that error)
    "missized": (
        f'{mn.RESERVATIONS.promql}_total{{outcome="scheduling_missized_request",hosts="2"}}',
        "missized",
        4,
    ),
    "missized-errors": (
        f'{mn.ERRORS.promql}_total{{workload="reservation",'
        'error_class="scheduling_missized_request"}',
        "missized",
        4,
    ),
    "nan": (
        f'{mn.ERRORS.promql}_total{{workload="train",error_class="runtime_nan"}}',
        "nan",
        5,
    ),
    "bad-input": (
        f'{mn.SERVE_REQUESTS.promql}_total{{status_class="4xx",error_class="bad_input"}}',
        None,
        None,
    ),
    # The router's answers when the fallback upstream fails (exit codes: test_obs_errors_live).
    "upstream-429": (
        f'{mn.SERVE_REQUESTS.promql}_total{{status_class="4xx",'
        'error_class="upstream_rate_limited"}',
        None,
        None,
    ),
    "upstream-429-errors": (
        f'{mn.ERRORS.promql}_total{{workload="serve",error_class="upstream_rate_limited"}}',
        None,
        None,
    ),
    "timeout": (
        f'{mn.SERVE_REQUESTS.promql}_total{{status_class="5xx",error_class="network_timeout"}}',
        None,
        None,
    ),
    "timeout-errors": (
        f'{mn.ERRORS.promql}_total{{workload="serve",error_class="network_timeout"}}',
        None,
        None,
    ),
}


@pytest.mark.parametrize(
    ("key", "produced_by", "exit_code"),
    [(key, by, code) for key, (_, by, code) in ERROR_SERIES.items()],
    ids=list(ERROR_SERIES),
)
def test_error_class_reaches_the_metric_label_and_the_exit_code(
    scraped: dict[str, Any], key: str, produced_by: str | None, exit_code: int | None
) -> None:
    poller: Poller = scraped["poller"]
    result = poller.results.get(f"errors/{key}")
    assert result, f"no series {ERROR_SERIES[key][0]}"
    assert float(result[0]["value"][1]) >= 1
    labels = result[0]["metric"]
    assert (labels["stack"], labels["generation"]) == ("local", "v6e"), labels
    assert labels["slice"] in ("train", "serve"), labels  # the router's too, wherever it ran
    if produced_by is not None:
        assert failure.report(scraped[produced_by]) == exit_code
