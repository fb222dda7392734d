"""Property-based (Hypothesis): whatever a hostile but fair user writes into a file the CLI reads,
``raytpu`` exits 0, 1 or 2 with a message, never a traceback (exit 3), within a time and memory
bound; whatever a client POSTs, the server answers 2xx/4xx, never 500.

Inputs: random bytes, byte-level damage of valid files, and structured mutations (a field
replaced, removed, wrapped, or its value made odd) of valid manifests, Pulumi JSON, stack files
and request bodies. Derandomized, so CI sees the same examples each run; the whole file is
sized to run in well under a minute.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile import run_cli, write_project
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policies_factories import cluster_spec, node_pool_props, ray_object, tpu_group

from raytpu import catalog
from workloads.serving.requests import (
    RequestError,
    error_reply,
    pad_to_bucket,
    parse_request,
    render_replies,
    run_isolated,
)

REPO = Path(__file__).resolve().parents[1]
V6E_4X4 = catalog.shape("v6e", "4x4")
CLI_CODES = {0, 1, 2}
SECONDS = 10.0
MIB = 200.0

PROPERTY = settings(
    derandomize=True,
    database=None,
    deadline=None,  # the bound is asserted on each run instead (first runs import modules)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# ------------------------------------------------------------------------------ strategies
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
ODD_STRINGS = st.sampled_from(
    [
        "",
        "RayClustr",
        "RayCluster",
        "List",
        "v1",
        "ray.io/v1",
        "2.60.0",
        "\uff12.\uff16\uff10",
        "latest",
        "-1",
        "1e999",
        "null",
        "kubernetes:ray.io/v1:RayCluster",
        "a" * 300,
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
    | ODD_STRINGS
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(TEXT | ODD_STRINGS, inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def mutated(draw: Any, valid: Any, count: int = 3) -> Any:
    """``valid`` with 1..count structured mutations at random paths."""
    document = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, count))):
        paths = _paths(document)
        path = draw(st.sampled_from(paths))
        operation = draw(st.sampled_from(["replace", "delete", "wrap", "odd", "empty"]))
        if not path:
            document = draw(VALUES) if operation == "replace" else [document]
            continue
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        key = path[-1]
        if operation == "delete":
            del parent[key]
        elif operation == "wrap":
            parent[key] = [parent[key]]
        elif operation == "odd":
            parent[key] = draw(ODD_STRINGS | st.integers(-5, 5) | st.none())
        elif operation == "empty":
            parent[key] = draw(st.sampled_from([{}, [], "", 0]))
        else:
            parent[key] = draw(VALUES)
    return document


@st.composite
def damaged(draw: Any, valid: bytes) -> bytes:
    """``valid`` bytes truncated, with bytes flipped, inserted or deleted."""
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        operation = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if operation == "flip":
            data[at] = draw(st.integers(0, 255))
        elif operation == "insert":
            data[at:at] = draw(st.sampled_from([b"[", b"{", b"&a ", b"*a", b"\xff", b"\0", b":"]))
        elif operation == "delete":
            del data[at]
        else:
            del data[at:]
    return bytes(data)


def assert_clean_cli(*argv: str) -> None:
    run = run_cli(*argv, measure_memory=True)
    assert run.code in CLI_CODES, (run.code, run.err[-2000:])
    assert "Traceback" not in run.err and "internal error" not in run.err, run.err[-2000:]
    assert run.seconds < SECONDS, run.seconds
    assert run.peak_mib < MIB, run.peak_mib


# ------------------------------------------------------------------------------ valid inputs
GOOD_CLUSTER = ray_object("RayCluster", "train", cluster_spec([tpu_group(V6E_4X4)]))
GOOD_EXPORT = {
    "version": 3,
    "deployment": {
        "manifest": {},
        "resources": [
            {
                "urn": f"urn:pulumi:dev::ray-tpu::{t}::{n}",
                "custom": True,
                "type": t,
                "inputs": i,
            }
            for t, n, i in [
                ("gcp:container/nodePool:NodePool", "slice-train-0", node_pool_props("v6e", "4x4")),
                ("kubernetes:ray.io/v1:RayCluster", "raycluster-train", GOOD_CLUSTER),
            ]
        ],
    },
}
GOOD_PREVIEW = {
    "steps": [
        {"op": "create", "newState": {"urn": r["urn"], "type": r["type"], "inputs": r["inputs"]}}
        for r in GOOD_EXPORT["deployment"]["resources"]
    ]
}
DEV_CONFIG = yaml.safe_load((REPO / "Pulumi.dev.yaml").read_text())
GOOD_BODY = {"prompt": "The old teacher", "max_new_tokens": 8, "temperature": 0.5}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    run_cli("check", "--help")  # import the command modules once, outside the bounds
    warm = folder / "warm.yaml"
    warm.write_text(yaml.safe_dump(GOOD_CLUSTER))
    assert run_cli("check", str(warm)).code == 0
    assert run_cli("preview", "dev", "--cwd", str(REPO)).code == 0  # imports the program
    return folder


def _write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


# ------------------------------------------------------------------------------ raytpu check
@settings(PROPERTY, max_examples=60)
@given(data=st.binary(max_size=600), name=st.sampled_from(["x.yaml", "x.json"]))
def test_check_on_random_bytes(scratch, data, name):
    assert_clean_cli("check", str(_write(scratch, name, data)))


@settings(PROPERTY, max_examples=40)
@given(data=damaged(yaml.safe_dump(GOOD_CLUSTER).encode()))
def test_check_on_damaged_manifests(scratch, data):
    assert_clean_cli("check", str(_write(scratch, "m.yaml", data)))


@settings(PROPERTY, max_examples=70)
@given(document=mutated(GOOD_CLUSTER))
def test_check_on_mutated_manifests(scratch, document):
    text = yaml.safe_dump(document, allow_unicode=True)
    assert_clean_cli("check", str(_write(scratch, "m.yaml", text.encode())))


@settings(PROPERTY, max_examples=60)
@given(document=mutated(GOOD_EXPORT) | mutated(GOOD_PREVIEW))
def test_check_on_mutated_pulumi_json(scratch, document):
    assert_clean_cli("check", str(_write(scratch, "p.json", json.dumps(document).encode())))


# ------------------------------------------------------------------------------ stack files
@settings(PROPERTY, max_examples=25)
@given(document=mutated(DEV_CONFIG, count=2))
def test_preview_on_mutated_stack_files(scratch, document):
    write_project(scratch / "proj", yaml.safe_dump(document, allow_unicode=True))
    assert_clean_cli("preview", "dev", "--cwd", str(scratch / "proj"))


@settings(PROPERTY, max_examples=30)
@given(data=damaged((REPO / "Pulumi.dev.yaml").read_bytes()) | st.binary(max_size=400))
def test_preview_on_damaged_stack_files(scratch, data):
    write_project(scratch / "proj", data)
    assert_clean_cli("preview", "dev", "--cwd", str(scratch / "proj"))


# ------------------------------------------------------------------------------ serve requests
def assert_answered(body: bytes) -> None:
    """The request path in-process: a 4xx refusal, or a request whose reply encodes (200)."""
    try:
        request = parse_request(body)
    except RequestError as error:
        assert 400 <= error.status < 500, error
        reply = error_reply(error.status, str(error))
        assert "error" in json.loads(reply.body)
        return
    (reply,) = render_replies([request], ["a completion"], {"batch_size": 1})
    assert reply.status == 200
    assert json.loads(reply.body)["prompt"] == request.prompt
    assert len(pad_to_bucket([request])) == 1


@settings(PROPERTY, max_examples=200)
@given(body=st.binary(max_size=300) | damaged(json.dumps(GOOD_BODY).encode()))
def test_serve_request_bytes(body):
    assert_answered(body)


@settings(PROPERTY, max_examples=200)
@given(
    document=mutated(GOOD_BODY)
    | st.fixed_dictionaries(
        {"prompt": st.text(max_size=30)},  # surrogates included
        optional={"max_new_tokens": SCALARS, "temperature": SCALARS},
    )
)
def test_serve_request_structures(document):
    body = json.dumps(document, ensure_ascii=True).encode()  # \\ud800 escapes, as a client sends
    assert_answered(body)


@settings(PROPERTY, max_examples=30)
@given(bad=st.sets(st.integers(0, 7), max_size=8), size=st.integers(1, 8))
def test_a_failing_row_answers_only_its_own_request(bad, size):
    requests = [parse_request(json.dumps({"prompt": f"p{i}"}).encode()) for i in range(size)]

    def run(batch):
        for request in batch:
            if int(request.prompt[1:]) in bad:
                raise ValueError(f"row {request.prompt} cannot run")
        return [f"done {r.prompt}" for r in batch]

    replies = render_replies(requests, run_isolated(requests, run), {})
    for index, reply in enumerate(replies):
        expected = 500 if index in bad else 200
        assert reply.status == expected
        if expected == 200:
            assert json.loads(reply.body)["completion"] == f"done p{index}"
