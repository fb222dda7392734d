"""The real pack: ``policies/__main__.py`` started as Pulumi starts it, asked over gRPC.

Pulumi runs the pack's program in ``policies/`` and reads the analyzer's port from its stdout;
this test does the same (no Pulumi CLI needed), then sends GetAnalyzerInfo and Analyze requests
the way the engine does during ``pulumi preview --policy-pack policies``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 120
RPC_TIMEOUT_S = 30


@pytest.fixture(scope="module")
def analyzer():
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    process = subprocess.Popen(
        [sys.executable, "-u", "__main__.py"],
        cwd=REPO / "policies",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    try:
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=STARTUP_TIMEOUT_S):
            raise TimeoutError(f"the policy pack printed no port within {STARTUP_TIMEOUT_S}s")
        line = process.stdout.readline().strip()
        if not line.isdigit():
            process.kill()
            raise RuntimeError(f"policy pack did not start: {line!r} {process.stderr.read()}")
        channel = grpc.insecure_channel(f"127.0.0.1:{line}")
        grpc.channel_ready_future(channel).result(timeout=RPC_TIMEOUT_S)
        yield analyzer_pb2_grpc.AnalyzerStub(channel)
        channel.close()
    finally:
        process.kill()
        process.wait(timeout=RPC_TIMEOUT_S)


def _analyze(stub, type_: str, props: dict):
    from google.protobuf import struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    properties = struct_pb2.Struct()
    properties.update(props)
    request = analyzer_pb2.AnalyzeRequest(
        type=type_, properties=properties, urn=f"urn:pulumi:dev::ray-tpu::{type_}::x", name="x"
    )
    return stub.Analyze(request, timeout=RPC_TIMEOUT_S)


def test_pack_announces_every_policy_mandatory_and_companions_advisory(analyzer):
    from google.protobuf import empty_pb2
    from pulumi.runtime.proto import analyzer_pb2

    from policies.pack import COMPANIONS, POLICIES, policy_names

    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=RPC_TIMEOUT_S)
    assert info.name == "ray-tpu"
    assert {p.name for p in info.policies} == set(policy_names())
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert {levels[p.name] for p in POLICIES} == {analyzer_pb2.MANDATORY}
    assert {levels[name] for name in COMPANIONS} == {analyzer_pb2.ADVISORY}


def test_pack_blocks_a_mismatched_node_pool_and_survives_unknowns(analyzer):
    from policies_factories import edit, node_pool_props

    good = node_pool_props("v6e", "4x4")
    assert list(_analyze(analyzer, "gcp:container/nodePool:NodePool", good).diagnostics) == []
    bad = edit(good, "nodeCount", 3.0)
    (diagnostic,) = _analyze(analyzer, "gcp:container/nodePool:NodePool", bad).diagnostics
    assert diagnostic.policyName == "tpu-node-pool-shape"
    assert "nodeCount: 3" in diagnostic.message
    unknown = edit(bad, "placementPolicy.tpuTopology", "04da6b54-80e4-46f7-96ec-b56ff0331ba9")
    assert list(_analyze(analyzer, "gcp:container/nodePool:NodePool", unknown).diagnostics) == []
