"""The driver's account of a run's faults across its attempts (:class:`EventBook`).

After each attempt the driver reads the run's board (:class:`workloads.training.config.RunBoard`):
the events the workers posted (loss spikes, slow hosts, hangs with their stack dumps), the
injected faults that fired, the tier and step each attempt restored. A failed attempt becomes one
event of class ``hang`` (a worker's watchdog said so), ``preemption``, ``host_loss`` (a worker
or its host went away) or ``slice_loss`` (every host of a slice went away), or ``slow_host`` (policy ``restart``: the workers left a slow host's
slice, which :attr:`EventBook.cordons` names for the driver to hold), with the action taken; its
``duration_s`` is the recovery time, from the failure until the next attempt finished its first
step. ``events.jsonl`` and ``stacks/`` in
the run's log dir hold the same. Ray is imported inside the methods.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from workloads.training.goodput import MOVE_ACTION, GoodputEvent

NOT_RESTARTABLE = ("runtime_nan", "bad_input")
"""Error classes a restart from a checkpoint would only repeat."""
LOST_KINDS = {"kill-host": "host_loss", "kill-slice": "slice_loss", "preempt": "preemption"}
"""Injected faults that take hosts away -> the event class of the failed attempt."""


class EventBook:
    def __init__(self) -> None:
        self.events: list[GoodputEvent] = []
        self.fired: list[str] = []
        self.cordons: list[str] = []
        """Slices a slow host was found on (policy ``restart``): held until the run ends."""
        self.slow_hosts: dict[str, str] = {}
        """Injected slow-host faults that fired: spec -> the host (``slice/worker``) they hit."""
        self.stack_files: list[str] = []
        self._seen_events = 0
        self._seen_fired = 0
        self._pending: tuple[int, float] | None = None
        self._attempt = 0

    # -- after an attempt ------------------------------------------------------------------
    def failed(self, board: Any, error: BaseException, log_dir: Path, may_restart: bool) -> bool:
        """Record the failed attempt; whether to restart it."""
        from raytpu import errors

        failed_at = time.time()
        progress, worker_events, fired = self._read(board)
        hangs = [e for e in worker_events if e["kind"] == "hang"]
        preempted = [e for e in worker_events if e["kind"] == "preemption"]
        moves = [
            e for e in worker_events if e["kind"] == "slow_host" and e["action"] == MOVE_ACTION
        ]
        self.events.extend(
            GoodputEvent(**e)
            for e in worker_events
            if e["kind"] not in ("hang", "preemption") and e not in moves
        )
        stacks = self._save_stacks(board, log_dir)
        error_class = errors.classify(error).label
        kind: str | None
        lost = [f for f in fired if f["kind"] in LOST_KINDS]
        culprits = sorted({h["host"] for h in hangs if h["host"]})
        if moves:
            move = moves[-1]
            kind, step, host, detail = "slow_host", int(move["step"]), move["host"], move["detail"]
        elif error_class in NOT_RESTARTABLE:
            kind, step, host, detail = None, progress["last_step"], "", error_class
        elif preempted or lost:
            # First: a host that went away leaves its peers waiting in a collective, and their
            # watchdogs may fire before Ray Train sees the loss.
            # The drained host's last word (it says so before and after its emergency save).
            # A repaired slice's hosts were drained for it: its peers may read that as a notice.
            repaired = [f for f in lost if f["kind"] == "kill-slice"]
            if preempted and not repaired:
                source, kind, detail = preempted[-1], "preemption", preempted[-1]["action"]
            else:
                source = (repaired or lost)[-1]
                kind, detail = LOST_KINDS[source["kind"]], f"injected {source['spec']}"
            step, host = int(source["step"]), source["host"]
        elif culprits:
            kind, step, host = "hang", min(int(h["step"]) for h in hangs), ",".join(culprits)
            first = next(h for h in hangs if h["host"])
            detail = f"{first['detail']}; stacks of {len(hangs)} worker(s): {', '.join(stacks)}"
        else:
            # A worker or its host went away without a word (its peers, if they said anything,
            # were waiting for it inside a collective): a lost host.
            kind, step, host = "host_loss", int(progress["last_step"]), ""
            detail = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        restart = kind is not None and may_restart
        if restart and moves:
            slice_name = host.split("/")[0]
            self.cordons.append(slice_name)
            action = f"{MOVE_ACTION}, slice {slice_name} held until the run ends"
        elif restart:
            action = "restart from the newest checkpoint"
        elif kind is None:
            action = f"fail ({error_class}: a restart would repeat it)"
        else:
            action = "fail (restart limit reached)"
        self.events.append(GoodputEvent(kind or "failure", step, host, action, 0.0, detail))
        self._pending = (len(self.events) - 1, failed_at) if restart else None
        self._attempt += 1
        return restart

    def finished(self, board: Any) -> None:
        _, worker_events, _ = self._read(board)
        self.events.extend(GoodputEvent(**e) for e in worker_events)

    def _read(self, board: Any) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict]]:
        import ray

        progress = ray.get(board.progress.remote(), timeout=30)
        restores = ray.get(board.restores.remote(), timeout=30)
        if self._pending is not None and progress["first_step_wall"] is not None and restores:
            index, failed_at = self._pending
            tier, step = restores[-1]
            pending = self.events[index]
            self.events[index] = replace(
                pending,
                action=f"{pending.action}: resumed from the {tier} tier at step {step}",
                duration_s=max(0.0, progress["first_step_wall"] - failed_at),
            )
            self._pending = None
        worker_events = ray.get(board.events.remote(), timeout=30)[self._seen_events :]
        self._seen_events += len(worker_events)
        fired = ray.get(board.fired_faults.remote(), timeout=30)[self._seen_fired :]
        self._seen_fired += len(fired)
        self.fired.extend(f["spec"] for f in fired)
        self.slow_hosts.update({f["spec"]: f["host"] for f in fired if f["kind"] == "slow-host"})
        return progress, worker_events, fired

    def _save_stacks(self, board: Any, log_dir: Path) -> list[str]:
        import ray

        dumps = ray.get(board.stack_dumps.remote(), timeout=30)
        folder = log_dir / "stacks"
        saved = []
        for host, text in sorted(dumps.items()):
            path = folder / f"attempt-{self._attempt}-{host.replace('/', '-')}.txt"
            if str(path) in self.stack_files:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            self.stack_files.append(str(path))
            saved.append(str(path))
        ray.get(board.clear_stacks.remote(), timeout=30)
        return saved

    # -- output ----------------------------------------------------------------------------
    def write(self, log_dir: Path) -> Path:
        path = log_dir / "events.jsonl"
        lines = (json.dumps(asdict(e)) for e in self.events)
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        return path

    def summary(self) -> str:
        if not self.events:
            return "events: none"
        return "events:\n" + "\n".join(f"  - {e.line()}" for e in self.events)
