"""Goodput: what keeps a training run productive through hangs, loss spikes and slow hosts.

Stdlib only (the driver imports it); the workers run the detectors every step.

- :class:`GoodputConfig`: restart limit, fast checkpoint tier, detector thresholds, policies and
  injected faults (:mod:`workloads.training.faults`) of a run (``TrainConfig.goodput``).
- :class:`SpikeDetector`: a loss is a **spike** when it lies more than ``k`` x MAD (median absolute
  deviation) above the median of the last ``window`` accepted losses.
- :func:`hang_threshold` and :class:`Watchdog`: a **hang** is no step for
  ``max(k x median step time, floor)`` seconds (``startup_timeout_s`` before the first step, which
  bounds the first collective of a partial slice); the watchdog dumps every thread's stack
  (faulthandler) to the run's log dir and ends the worker, so the attempt restarts.
- :class:`SlowHostDetector`: step time over ``baseline / fraction`` for ``steps`` steps in a row,
  each explained by the same host's own (pre-collective) time, flags that host.
- :class:`GoodputEvent`: one fault and what was done about it; :func:`goodput`.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytpu.errors import invalid

SPIKE_POLICIES = ("log", "skip", "rollback")
SLOW_POLICIES = ("warn", "restart")
MOVE_ACTION = "restart on a spare slice"
"""A ``slow_host`` event's action when the attempt ends to leave the slow host's slice."""


@dataclass(frozen=True)
class GoodputConfig:
    max_restarts: int = 2
    """Attempts after the first that a lost host, hang or preemption may start."""
    fast_every: int = 5
    """Steps between fast-tier checkpoints (each host's local disk); 0: none."""
    fast_dir: str = "raytpu-fast-tier"
    """The fast tier on each host: absolute (a local SSD mount on GKE) or under its temp folder."""
    spike_policy: str = "skip"
    spike_k: float = 8.0
    spike_window: int = 16
    spike_min_history: int = 6
    hang_k: float = 10.0
    hang_floor_s: float = 30.0
    startup_timeout_s: float = 300.0
    checkpoint_timeout_s: float = 300.0
    """Bound on one checkpoint save or restore (the hang bound while one runs)."""
    slow_fraction: float = 0.5
    slow_steps: int = 3
    slow_min_excess_s: float = 0.1
    """A step only counts as slow when it takes at least this much longer than the baseline."""
    slow_policy: str = "warn"
    """``warn``: the slow host is named in an event. ``restart``: when a spare slice of the shape
    is free, an emergency durable checkpoint, then the attempt restarts from it on another slice
    while the slow host's slice is held (cordoned) until the run ends; with no spare, a warning."""
    preempt_check_every: int = 10
    """Steps between reads of Ray Train's preemption notice (``ray.train.get_preemption_info``,
    a round trip through Ray Train's collective); at 1 s a step, 10 s of a 30 s notice."""
    preempt_grace_s: float = 25.0
    """Seconds a preemption notice leaves when Ray reports no deadline (an emergency save only if
    the last durable save's time fits); ``preempt`` faults drain their node with this deadline."""
    faults: tuple[str, ...] = ()
    """Injected faults (``workloads.training.faults`` specs)."""
    log_dir: str = ""
    """The driver's folder for the event log and stack dumps; default ``$TMPDIR/raytpu-runs/NAME``."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GoodputConfig:
        return cls(**{**raw, "faults": tuple(raw.get("faults", ()))})

    def validate(self) -> None:
        from workloads.training.faults import parse_faults

        checks = [
            ("max_restarts", self.max_restarts, self.max_restarts >= 0, "an integer >= 0"),
            ("fast_every", self.fast_every, self.fast_every >= 0, "an integer >= 0"),
            ("spike_policy", self.spike_policy, self.spike_policy in SPIKE_POLICIES,
             ", ".join(SPIKE_POLICIES)),
            ("spike_k", self.spike_k, self.spike_k > 0, "> 0"),
            ("spike_window", self.spike_window, self.spike_window >= 3, "an integer >= 3"),
            ("spike_min_history", self.spike_min_history,
             3 <= self.spike_min_history <= self.spike_window, f"3..{self.spike_window}"),
            ("hang_k", self.hang_k, self.hang_k > 1, "> 1"),
            ("hang_floor_s", self.hang_floor_s, self.hang_floor_s > 0, "> 0 seconds"),
            ("startup_timeout_s", self.startup_timeout_s, self.startup_timeout_s > 0, "> 0"),
            ("checkpoint_timeout_s", self.checkpoint_timeout_s, self.checkpoint_timeout_s > 0,
             "> 0"),
            ("slow_fraction", self.slow_fraction, 0 < self.slow_fraction < 1, "0 < x < 1"),
            ("slow_steps", self.slow_steps, self.slow_steps >= 1, "an integer >= 1"),
            ("slow_min_excess_s", self.slow_min_excess_s, self.slow_min_excess_s >= 0,
             ">= 0 seconds"),
            ("slow_policy", self.slow_policy, self.slow_policy in SLOW_POLICIES,
             ", ".join(SLOW_POLICIES)),
            ("preempt_check_every", self.preempt_check_every, self.preempt_check_every >= 1,
             "an integer >= 1"),
            ("preempt_grace_s", self.preempt_grace_s, self.preempt_grace_s >= 0, ">= 0"),
        ]  # fmt: skip
        for name, value, ok, valid in checks:
            if not ok:
                raise ValueError(invalid(f"train.goodput.{name}", value, valid))
        parse_faults(self.faults, field="train.goodput.faults")


@dataclass(frozen=True)
class GoodputEvent:
    """One fault: its class (:data:`raytpu.metric_names.FAULT_CLASSES`), the step, the host, what was done, how long the
    recovery took (seconds from the failure until training ran again; 0 for in-place actions)."""

    kind: str
    step: int
    host: str
    action: str
    duration_s: float = 0.0
    detail: str = ""

    def line(self) -> str:
        return (
            f"{self.kind} at step {self.step} on {self.host or '-'}: {self.action} "
            f"({self.duration_s:.1f} s){' - ' + self.detail if self.detail else ''}"
        )


def goodput(productive_s: float, wall_s: float) -> float:
    """Productive step time over wall time (0 when nothing ran)."""
    return 0.0 if wall_s <= 0 else min(1.0, productive_s / wall_s)


# ------------------------------------------------------------------------------ loss spikes
MAD_FLOOR = 0.025
"""The MAD used is at least this fraction of the median."""


class SpikeDetector:
    """Rolling median / MAD over the last ``window`` accepted losses, around their trend.

    Early in a run the loss falls fast: the raw median and MAD of a window of falling losses sit
    far above the next expected loss (a window of 16 falling from 5.6 to 3.3 put the limit above
    the ~6 of a batch of random bytes, so an early corrupt batch went unseen). So a falling
    trend is taken out first: the Theil-Sen slope (the median of every pair's slope, robust to
    the spike-free noise and to one outlier; a rising trend is not extrapolated), the median and
    MAD of the losses less that trend, and the expected next loss projected one step on, but
    never below the lowest of the last three (a decelerating curve falls slower than the line
    through its window). On a flat window this is the plain median / MAD.
    """

    def __init__(
        self, k: float, window: int, min_history: int, history: Sequence[float] = ()
    ) -> None:
        self.k = k
        self.min_history = min_history
        self.losses: deque[float] = deque(history, maxlen=window)

    def threshold(self) -> float | None:
        """The loss above which a step is a spike; None until ``min_history`` losses."""
        if len(self.losses) < self.min_history:
            return None
        losses = list(self.losses)
        n = len(losses)
        slopes = [(losses[j] - losses[i]) / (j - i) for i in range(n) for j in range(i + 1, n)]
        slope = min(0.0, statistics.median(slopes)) if slopes else 0.0
        detrended = [x - slope * i for i, x in enumerate(losses)]
        level = statistics.median(detrended)
        mad = statistics.median(abs(x - level) for x in detrended)
        expected = max(level + slope * n, min(losses[-3:]))
        # A flat window has MAD ~0: a floor of 2.5 % of the expected loss (k = 8: at least 20 %
        # above it) keeps batch-to-batch noise from being a spike once the loss plateaus (1 %
        # let a 200-step run of the tiny model flag three +8 % wobbles).
        return expected + self.k * max(mad, MAD_FLOOR * abs(expected))

    def is_spike(self, loss: float) -> bool:
        """Whether ``loss`` is a spike; a loss that is not enters the window."""
        limit = self.threshold()
        if limit is not None and loss > limit:
            return True
        self.losses.append(loss)
        return False


# ------------------------------------------------------------------------------------ hangs
def hang_threshold(step_seconds: Sequence[float], k: float, floor_s: float) -> float:
    """``max(k x median step time, floor)``; ``floor`` before any step time is known."""
    if not step_seconds:
        return floor_s
    return max(k * statistics.median(step_seconds), floor_s)


def dump_stacks(log_dir: Path, name: str) -> Path:
    """Every thread's Python stack of this process into ``log_dir/name`` (faulthandler)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / name
    with path.open("w", encoding="utf-8") as out:
        out.write(f"pid {os.getpid()} at {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
        out.flush()
        faulthandler.dump_traceback(file=out, all_threads=True)
    return path


class Watchdog:
    """A daemon thread over one worker's step progress: ``on_hang(step, waited_s, limit_s)`` runs
    once when no :meth:`beat` came for the hang threshold (``startup_s`` before the first)."""

    def __init__(
        self,
        *,
        k: float,
        floor_s: float,
        startup_s: float,
        on_hang: Callable[[int, float, float], None],
        poll_s: float = 0.25,
        recent: int = 32,
    ) -> None:
        self.k, self.floor_s, self.startup_s = k, floor_s, startup_s
        self._on_hang = on_hang
        self._poll_s = poll_s
        self._times: deque[float] = deque(maxlen=recent)
        self._step = -1
        self._allow = 0.0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._last = time.monotonic()
        self._thread.start()
        return self

    def beat(self, step: int, seconds: float | None = None) -> None:
        if seconds is not None:
            self._times.append(seconds)
        self._step = step
        self._allow = 0.0
        self._last = time.monotonic()

    def expect(self, seconds: float) -> None:
        """Before a known long operation (a checkpoint): until the next :meth:`beat`, the limit
        is at least ``seconds``, counted from now."""
        self._allow = seconds
        self._last = time.monotonic()

    def limit_s(self) -> float:
        if self._step < 0:
            return max(self.startup_s, self._allow)
        return max(hang_threshold(list(self._times), self.k, self.floor_s), self._allow)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            waited = time.monotonic() - self._last
            limit = self.limit_s()
            if waited > limit:
                self._stop.set()
                self._on_hang(self._step, waited, limit)


# ------------------------------------------------------------------------------- slow hosts
@dataclass
class SlowHostDetector:
    """The run's baseline is the median step time of steps ``skip`` .. ``skip + baseline_steps``
    (after compilation). A step is **slow because of host h** when it takes longer than
    ``baseline / fraction`` and at least ``min_excess_s`` more than the baseline, and h's own
    (pre-collective) time exceeds the median of the other hosts' own times by at least
    ``baseline / fraction - baseline``: h's own extra work alone makes a step slow. ``steps``
    such steps in a row, all naming the same host, flag it, once per host.

    A step that is slow everywhere (a loaded machine, a slow collective) names no host: the
    hosts' own times stay alike. A chip that is slow in its compute does not show in its
    host's own time either (the step's collectives make every host wait alike), so this
    detector names hosts slowed in their own work: input pipeline, CPU, throttling."""

    fraction: float
    steps: int
    baseline_steps: int = 3
    skip: int = 1
    min_excess_s: float = 0.0
    _seen: list[float] = field(default_factory=list)
    _run: list[int] = field(default_factory=list)
    flagged: set[int] = field(default_factory=set)

    @property
    def baseline(self) -> float | None:
        window = self._seen[self.skip : self.skip + self.baseline_steps]
        return statistics.median(window) if len(window) == self.baseline_steps else None

    def culprit(self, step_s: float, host_s: Sequence[float]) -> int | None:
        """The host whose own time explains this step's slowness, if the step is slow."""
        baseline = self.baseline
        if baseline is None or not host_s:
            return None
        excess = step_s - baseline
        if step_s <= baseline / self.fraction or excess < self.min_excess_s:
            return None
        slowest = max(range(len(host_s)), key=host_s.__getitem__)
        others = [t for i, t in enumerate(host_s) if i != slowest]
        own_excess = host_s[slowest] - (statistics.median(others) if others else 0.0)
        # Its own extra time alone would make a baseline step slow (load on top does not
        # change that: comparing with the step's whole excess missed slow steps under load).
        return slowest if own_excess >= baseline * (1 / self.fraction - 1) else None

    def observe(self, step_s: float, host_s: Sequence[float]) -> int | None:
        """One step's time and each host's own time; the slow host's index when flagged."""
        culprit = self.culprit(step_s, host_s)
        self._seen.append(step_s)
        if culprit is None or (self._run and self._run[-1] != culprit):
            self._run.clear()
        if culprit is None:
            return None
        self._run.append(culprit)
        if len(self._run) < self.steps:
            return None
        self._run.clear()
        if culprit in self.flagged:
            return None
        self.flagged.add(culprit)
        return culprit


# ------------------------------------------------------------------------------ preemption
def seconds_left(deadline_ms: int | None, grace_s: float, now_s: float) -> float:
    """Seconds until a preemption notice's deadline (``PreemptionInfo.deadline_ms``, UNIX ms);
    ``grace_s`` (the config's guess: GKE gives a spot TPU VM 30 s) when Ray reported none."""
    if not deadline_ms:
        return grace_s
    return max(0.0, deadline_ms / 1000.0 - now_s)
