"""Run the Pulumi program offline, under ``pulumi.runtime.set_mocks``: no engine, no cloud.

Every resource the program registers is recorded with its inputs *as the engine sees them*
(camelCase keys, numbers as floats) and the stack outputs are resolved. Runs are repeatable in
one process: each run resets Pulumi's runtime settings and its root stack.

    resources, outputs = run_stack("dev")
"""

from __future__ import annotations

import asyncio
import atexit
import base64
import json
import runpy
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.config.schema import StackConfig
from infra.config.stack import load_stack, project_root

__all__ = [
    "DeclaredResource",
    "ProgramRun",
    "engine_config",
    "held_back",
    "run_entrypoint",
    "run_program",
    "run_program_detailed",
    "run_stack",
    "run_with_failures",
]

PROJECT = "ray-tpu"
TIMEOUT_S = 120.0
"""Longest a mock run may take (a 100-slice stack takes seconds): a hang becomes an error."""
MOCK_ENDPOINT = "203.0.113.10"
MOCK_PROJECT_NUMBER = "123456789012"
"""What ``gcp.organizations.get_project`` answers under mocks (the real one: the project's number)."""
MOCK_CA = base64.b64encode(
    b"-----BEGIN CERTIFICATE-----\nmock\n-----END CERTIFICATE-----\n"
).decode()


@dataclass(frozen=True)
class DeclaredResource:
    """One ``RegisterResource`` call of the program."""

    type: str
    """Pulumi type token, e.g. ``gcp:container/nodePool:NodePool``."""
    name: str
    urn: str
    props: dict[str, Any]
    """Inputs as the engine sees them: camelCase keys, numbers as floats."""
    parent: str | None
    """URN of the parent resource (``None`` for the root stack)."""
    custom: bool = True
    """False for component resources."""
    dependencies: tuple[str, ...] = ()
    """URNs this resource waits for (``depends_on`` and inputs from other resources)."""
    ignore_changes: tuple[str, ...] = ()
    """Input properties Pulumi leaves alone after creation (``ResourceOptions.ignore_changes``)."""
    retain_on_delete: bool = False
    """Whether deleting it from the stack leaves it in the cloud (``retain_on_delete``)."""


@dataclass(frozen=True)
class ProgramRun:
    resources: list[DeclaredResource]
    outputs: dict[str, Any]
    secret_outputs: frozenset[str] = field(default_factory=frozenset)
    error: BaseException | None = None

    def of_type(self, type_: str) -> list[DeclaredResource]:
        return [r for r in self.resources if r.type == type_]


def _mock_state(type_: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Plausible outputs the cloud would return for a resource (inputs plus computed fields)."""
    state = dict(inputs)
    if type_ == "gcp:container/cluster:Cluster":
        state.setdefault("name", name)
        state["endpoint"] = MOCK_ENDPOINT
        state["masterAuth"] = {
            "clusterCaCertificate": MOCK_CA,
            "clientCertificateConfig": {"issueClientCertificate": False},
        }
        state["selfLink"] = f"https://container.googleapis.com/v1/clusters/{state['name']}"
    elif type_ == "gcp:container/nodePool:NodePool":
        state.setdefault("name", name)
        state["instanceGroupUrls"] = [f"https://compute.googleapis.com/mock/igm/{state['name']}"]
    elif type_ == "random:index/randomPassword:RandomPassword":
        state["result"] = f"mock-password-{name}"  # the provider generates it at create
    elif type_ == "gcp:compute/resourcePolicy:ResourcePolicy":
        state.setdefault("name", name)
        state["selfLink"] = f"https://compute.googleapis.com/mock/resourcePolicies/{state['name']}"
    return state


STOCKOUT = (
    "ZONE_RESOURCE_POOL_EXHAUSTED: The zone does not have enough resources available to "
    "fulfill the request. Try a different zone, or try again later."
)
"""What the mock cloud answers for a resource named in ``failing``: Compute Engine's stockout."""


def _run(
    body: Callable[[], None],
    *,
    stack: str,
    config: Mapping[str, str],
    failing: Collection[str] = (),
) -> ProgramRun:
    """Run ``body`` (which declares resources) under mocks and record everything it does; the
    creation of each custom resource named in ``failing`` fails as a stockout does."""
    import pulumi
    from pulumi.runtime import config as runtime_config
    from pulumi.runtime import mocks, rpc, settings
    from pulumi.runtime.proto import resource_pb2
    from pulumi.runtime.stack import run_pulumi_func
    from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

    records: list[DeclaredResource] = []

    class Mocks(pulumi.runtime.Mocks):
        def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
            if args.name in failing:
                raise RuntimeError(f"creating {args.typ} {args.name!r}: {STOCKOUT}")
            return f"{args.name}-id", _mock_state(args.typ, args.name, args.inputs)

        def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list]:
            if args.token == "gcp:organizations/getProject:getProject":
                project = args.args.get("projectId") or "mock-project"
                return {"projectId": project, "number": MOCK_PROJECT_NUMBER}, []
            return {}, []

    class RecordingMonitor(mocks.MockMonitor):
        def RegisterResource(self, request: Any) -> resource_pb2.RegisterResourceResponse:
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                # The mock monitor answers on executor threads; for resources it gives each
                # thread an event loop of its own, which must be closed before exit.
                _close_at_exit(_ensure_event_loop())
                records.append(
                    DeclaredResource(
                        type=request.type,
                        name=request.name,
                        urn=response.urn,
                        # Deserialized exactly as the mock monitor hands them to new_resource.
                        props=dict(rpc.deserialize_properties(request.object)),
                        parent=request.parent or None,
                        custom=bool(request.custom),
                        dependencies=tuple(request.dependencies),
                        ignore_changes=tuple(request.ignoreChanges),
                        retain_on_delete=bool(request.retainOnDelete),
                    )
                )
            return response

    # asyncio.run() elsewhere in this thread leaves it with no current loop; Pulumi needs one.
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    # A fresh runtime for every run: no root stack, no pending RPCs or outputs, only this run's
    # config.
    settings.reset_options(project=PROJECT, stack=stack, preview=False)
    _drop_pending_outputs(settings.SETTINGS)
    runtime_config.set_all_config(dict(config), [])
    mock_impl = Mocks()
    mocks.set_mocks(
        mock_impl, project=PROJECT, stack=stack, preview=False, monitor=RecordingMonitor(mock_impl)
    )
    root = settings.get_root_resource()
    outputs: dict[str, Any] = {}
    secret: set[str] = set()
    error: BaseException | None = None
    try:
        _sync_await(asyncio.wait_for(run_pulumi_func(body), TIMEOUT_S))
        for key, value in getattr(root, "outputs", {}).items():
            output = pulumi.Output.from_input(value)
            outputs[key] = _sync_await(asyncio.wait_for(output.future(), TIMEOUT_S))
            if _sync_await(output.is_secret()):
                secret.add(key)
    except TimeoutError as late:
        error = TimeoutError(
            f"the Pulumi program did not finish under mocks within {TIMEOUT_S:.0f} s "
            "(an Output that never resolves?)"
        )
        error.__cause__ = late
    except Exception as caught:  # handed back to the caller in ProgramRun.error
        error = caught
    finally:
        runtime_config.set_all_config({}, [])
        _drop_pending_outputs(settings.SETTINGS)
        settings.reset_options(project=PROJECT, stack=stack)
        _close_at_exit(asyncio.get_event_loop())
    return ProgramRun(records, outputs, frozenset(secret), error)


_LOOPS_CLOSED_AT_EXIT: set[int] = set()


def _close_at_exit(loop: asyncio.AbstractEventLoop) -> None:
    """Close the event loop Pulumi's ``_sync_await`` ran on when the interpreter exits.

    Left to the garbage collector at shutdown, the loop is finalized after its self-pipe socket
    and prints "Exception ignored in BaseEventLoop.__del__ ... Invalid file descriptor: -1".
    """
    if id(loop) in _LOOPS_CLOSED_AT_EXIT:
        return
    _LOOPS_CLOSED_AT_EXIT.add(id(loop))

    def close() -> None:
        if not loop.is_running() and not loop.is_closed():
            loop.close()

    atexit.register(close)


def _drop_pending_outputs(runtime_settings: Any) -> None:
    """Cancel outputs a previous (failed or timed-out) run left behind; otherwise the next run
    would wait for them."""
    with runtime_settings.lock:
        leftovers = list(runtime_settings.outputs)
        runtime_settings.outputs.clear()
    if not leftovers:
        return
    from pulumi.runtime.sync_await import _sync_await

    for task in leftovers:
        task.cancel()
    # Let the loop deliver the cancellations (and settle what the tasks were waiting on).
    _sync_await(asyncio.gather(*leftovers, return_exceptions=True))


def run_program_detailed(config: StackConfig, *, stack: str = "dev") -> ProgramRun:
    """Declare ``config`` under mocks; return resources, resolved outputs and secret names.

    An error of the program is raised (after the runtime is reset)."""
    from infra.program import declare

    run = _run(lambda: declare(config), stack=stack, config={})
    if run.error is not None:
        raise run.error
    return run


def run_with_failures(
    config: StackConfig, failing: Collection[str], *, stack: str = "dev"
) -> ProgramRun:
    """Declare ``config`` under mocks where creating each resource named in ``failing`` fails
    (a stockout); ``ProgramRun.error`` holds the failure, ``resources`` what was declared."""
    from infra.program import declare

    return _run(lambda: declare(config), stack=stack, config={}, failing=frozenset(failing))


def held_back(resources: Collection[DeclaredResource], failed: Collection[str]) -> set[str]:
    """The URNs that do not land when creating the resources named ``failed`` fails (a TPU
    stockout): those and every resource that waits on them, directly or not. Everything else
    is created by ``pulumi up --continue-on-error`` (the engine skips only the dependents of a
    failed step)."""
    waiting: dict[str, set[str]] = {}
    for resource in resources:
        for dependency in resource.dependencies:
            waiting.setdefault(dependency, set()).add(resource.urn)
    lost = {r.urn for r in resources if r.custom and r.name in failed}
    frontier = list(lost)
    while frontier:
        for urn in waiting.get(frontier.pop(), ()):
            if urn not in lost:
                lost.add(urn)
                frontier.append(urn)
    return lost


def engine_config(raw: Mapping[str, Any]) -> dict[str, str]:
    """``config:`` of a stack file as the engine hands it to a program: structured values as
    JSON text, everything else as strings."""
    encoded: dict[str, str] = {}
    for key, value in raw.items():
        if isinstance(value, str):
            encoded[key] = value
        else:
            encoded[key] = json.dumps(value)
    return encoded


def run_entrypoint(raw: Mapping[str, Any], *, stack: str = "dev") -> ProgramRun:
    """Run the real ``__main__.py`` (``from_pulumi()`` then ``declare``) with ``raw`` as the
    stack's config. Errors are returned in ``ProgramRun.error`` with whatever was declared
    before them (for a bad config: nothing)."""
    main = project_root() / "__main__.py"
    return _run(
        lambda: runpy.run_path(str(main), run_name="__main__"),
        stack=stack,
        config=engine_config(raw),
    )


def run_program(
    config: StackConfig, *, stack: str = "dev"
) -> tuple[list[DeclaredResource], dict[str, Any]]:
    """Declare ``config`` under mocks: (every resource with its inputs, resolved stack outputs)."""
    run = run_program_detailed(config, stack=stack)
    return run.resources, run.outputs


def run_stack(stack: str) -> tuple[list[DeclaredResource], dict[str, Any]]:
    """``load_stack(stack)`` then :func:`run_program`; a ``ConfigError`` comes before anything
    is declared."""
    return run_program(load_stack(stack), stack=stack)
