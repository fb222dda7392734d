"""A real Prometheus (Debian's ``prometheus``) scrapes the simulated slice cluster while a short
training run, a forced NaN run, a mis-sized reservation and a burst of serving requests happen;
then every PromQL expression of the dashboards and of the alert rules' signals must return data
with the expected labels, through Prometheus' HTTP API.

One cluster (the dev stack's slices: v6e 2x4 on two 4-chip hosts, v6e 2x2 serving host), one
Prometheus scraping every Ray node's metrics export port each second. Both stop in finalizers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
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

from infra import dashboards, monitoring_rules
from infra.config import load_stack
from raytpu import errors
from raytpu import metric_names as mn
from raytpu_cli import failure
from raytpu_cli.common import post_json
from workloads.local_cluster import LocalSliceCluster, free_port

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

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
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster up, Prometheus scraping it, the workloads run; yields what they produced."""
    import ray

    from workloads import serve as serving
    from workloads.reservation import SliceReservationError, reserve_slices
    from workloads.train import TrainConfig, TrainingError, run_training

    workdir = tmp_path_factory.mktemp("obs")
    stack = load_stack("dev")
    train, serve_slice = stack.slice("train"), stack.slice("serve")
    produced: dict[str, Any] = {}
    with LocalSliceCluster(stack.slices) as cluster:
        assert cluster.address
        targets = [f"127.0.0.1:{n['MetricsExportPort']}" for n in ray.nodes() if n["Alive"]]
        prometheus = Prometheus(targets, workdir)
        # The driver's series (reservations) carry the slice config name; the cluster's nodes
        # were started before this, so replicas keep labelling from their TPU_NAME.
        os.environ[mn.SLICE_ENV] = "train"
        try:
            prometheus.wait_ready()
            try:
                with reserve_slices(train.shape, tpu_per_bundle=8, timeout_s=3):
                    pytest.fail("a bundle of TPU 8 fits no 4-chip host")
            except SliceReservationError as error:
                produced["missized"] = error
            config = TrainConfig(
                checkpoint_dir=str(workdir / "ck"),
                steps=6,
                global_batch=8,
                checkpoint_every=3,
                log_every=3,
            )
            produced["trained"] = run_training(train.shape, config)
            nan_config = TrainConfig(
                checkpoint_dir=str(workdir / "ck-nan"),
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
            handle = serving.deploy(
                serving.build_app(config.checkpoint_dir, serve_slice.shape),
                port=free_port(),
                timeout_s=180,
            )
            try:
                prompts = [f"The TPU {i}" for i in range(8)]
                with ThreadPoolExecutor(4) as pool:
                    produced["replies"] = list(
                        pool.map(
                            lambda p: post_json(handle.url, {"prompt": p, "max_new_tokens": 4}),
                            prompts,
                        )
                    )
                produced["bad"] = post_json(handle.url, None, raw=b"{nope")
                produced["prometheus"] = prometheus
                yield produced
            finally:
                serving.shutdown()
        finally:
            os.environ.pop(mn.SLICE_ENV, None)
            prometheus.stop()


def _signals() -> list[tuple[str, str, tuple[str, ...]]]:
    found = [
        (where, dashboards.concrete(q.expr), q.labels) for where, q in dashboards.all_queries()
    ]
    found += [(f"alert/{a.name}", a.signal, mn.BASE_LABELS) for a in monitoring_rules.ALERTS]
    return found


def test_the_workloads_ran(scraped: dict[str, Any]) -> None:
    assert errors.classify(scraped["missized"]) == errors.MISSIZED_REQUEST
    assert scraped["trained"].final_step == 6
    assert errors.classify(scraped["nan"]) == errors.RUNTIME_NAN, str(scraped["nan"])
    assert [r.status for r in scraped["replies"]] == [200] * 8
    assert scraped["bad"].status == 400


def test_every_dashboard_and_alert_expression_returns_labelled_data(
    scraped: dict[str, Any],
) -> None:
    prometheus: Prometheus = scraped["prometheus"]
    pending = _signals()
    results: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while pending and time.monotonic() < deadline:
        still = []
        for where, expr, labels in pending:
            result = prometheus.query(expr)
            if result:
                results[where] = result
            else:
                still.append((where, expr, labels))
        pending = still
        if pending:
            time.sleep(2)
    assert not pending, "no data for: " + "; ".join(f"{w}: {e}" for w, e, _ in pending)
    for where, _, labels in _signals():
        for series in results[where]:
            assert set(labels) <= set(series["metric"]), (where, series["metric"])
            assert series["metric"]["stack"] == "local", where
            assert series["metric"]["generation"] == "v6e", where
            assert series["metric"]["slice"] in ("train", "serve"), (where, series["metric"])


ERROR_SERIES = {
    # (series selector, who produced it, the exit code the CLI gives that error)
    "missized": (
        f'{mn.RESERVATIONS.promql}_total{{outcome="scheduling_missized_request",hosts="2"}}',
        "missized",
        3,
    ),
    "missized-errors": (
        f'{mn.ERRORS.promql}_total{{workload="reservation",'
        'error_class="scheduling_missized_request"}',
        "missized",
        3,
    ),
    "nan": (
        f'{mn.ERRORS.promql}_total{{workload="train",error_class="runtime_nan"}}',
        "nan",
        4,
    ),
    "bad-input": (
        f'{mn.SERVE_REQUESTS.promql}_total{{status_class="4xx",error_class="bad_input"}}',
        None,
        None,
    ),
}


@pytest.mark.parametrize(
    ("selector", "produced_by", "exit_code"), ERROR_SERIES.values(), ids=ERROR_SERIES
)
def test_error_class_reaches_the_metric_label_and_the_exit_code(
    scraped: dict[str, Any], selector: str, produced_by: str | None, exit_code: int | None
) -> None:
    prometheus: Prometheus = scraped["prometheus"]
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while not (result := prometheus.query(selector)) and time.monotonic() < deadline:
        time.sleep(2)
    assert result, f"no series {selector}"
    assert float(result[0]["value"][1]) >= 1
    if produced_by is not None:
        assert failure.report(scraped[produced_by]) == exit_code
