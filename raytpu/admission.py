"""A small model of how Kueue admits whole-slice TPU workloads: a planning aid, not Kueue.

**Kueue is what admits workloads on the cluster.** This model follows Kueue's documented
classical preemption (kueue.sigs.k8s.io, "Preemption" and "Cohorts"; no fair sharing, one flavor
per workload) closely enough to answer planning questions offline: will this job start with
these quotas? whose job gives way when a team takes its quota back? Stdlib only.

Rules it models (quantities in whole slices of one flavor, so a workload is never split):

- A workload of ClusterQueue *q* fits when *q*'s usage stays within its nominal quota plus what
  it may borrow: at most ``borrowing_limit`` beyond nominal (None: no limit), and only from the
  idle quota its cohort lends (each queue lends ``lending_limit`` of its quota, None: all of it).
  A queue without a cohort never borrows.
- When it does not fit, Kueue looks for workloads to preempt:
  - in its own queue (``within``): ``LowerPriority`` ones, or also ``LowerOrNewerEqualPriority``
    ones (same priority, admitted later); ``Never``: none;
  - in other queues of the cohort (``reclaim``), only workloads of queues that are borrowing,
    and only if the pending workload fits within its own nominal quota: ``Any`` priority,
    ``LowerPriority`` only, or ``Never``. A workload that needs to borrow never preempts in
    other queues (``borrowWithinCohort: Never``).
  Candidates go in Kueue's order (other queues' first, then lowest priority, then the most
  recently admitted), are removed until the workload fits, then the ones not needed are put
  back. A preempted workload is evicted whole (all its slices) and requeued.
- Pending workloads are tried in priority order, then by submission (BestEffortFIFO: one that
  does not fit does not block the next).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from raytpu.errors import invalid

WITHIN = ("Never", "LowerPriority", "LowerOrNewerEqualPriority")
RECLAIM = ("Never", "LowerPriority", "Any")


@dataclass(frozen=True)
class Quota:
    """One flavor's quota of a ClusterQueue, in whole slices."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else self.lending_limit

    @property
    def guaranteed(self) -> int:
        """Slices no other queue can ever use (nominal minus what it lends)."""
        return self.nominal - self.lendable


@dataclass(frozen=True)
class ClusterQueue:
    name: str
    quotas: Mapping[str, Quota]
    """flavor -> quota."""
    cohort: str | None = None
    within: str = "LowerPriority"
    reclaim: str = "Any"

    def __post_init__(self) -> None:
        if self.within not in WITHIN:
            raise ValueError(invalid("within", self.within, WITHIN))
        if self.reclaim not in RECLAIM:
            raise ValueError(invalid("reclaim", self.reclaim, RECLAIM))


@dataclass(frozen=True)
class Workload:
    """A RayJob or RayCluster: ``slices`` whole slices of ``flavor`` from ``queue``."""

    name: str
    queue: str
    flavor: str
    slices: int
    priority: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.slices, int) or self.slices < 1:
            raise ValueError(invalid("slices", self.slices, "a whole number >= 1"))


@dataclass(frozen=True)
class Event:
    kind: str
    """``admitted``, ``preempted``, ``finished`` or ``pending``."""
    workload: str
    detail: str = ""


@dataclass
class Cluster:
    """ClusterQueues and their workloads; :meth:`submit` and :meth:`finish` run the scheduler."""

    queues: Mapping[str, ClusterQueue]
    admitted: dict[str, Workload] = field(default_factory=dict)
    """In admission order."""
    pending: dict[str, Workload] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    _order: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, queues: Iterable[ClusterQueue]) -> Cluster:
        return cls({q.name: q for q in queues})

    # ------------------------------------------------------------------ public
    def submit(self, workload: Workload) -> list[Event]:
        queue = self.queues.get(workload.queue)
        if queue is None:
            raise ValueError(invalid("queue", workload.queue, self.queues))
        if workload.flavor not in queue.quotas:
            raise ValueError(
                invalid(
                    "flavor",
                    workload.flavor,
                    f"{', '.join(queue.quotas)} (Kueue never admits a flavor the queue does not list)",
                    reason=f"queue {queue.name} does not list it",
                )
            )
        self._order[workload.name] = len(self._order)
        self.pending[workload.name] = workload
        return self._schedule()

    def finish(self, name: str) -> list[Event]:
        self.admitted.pop(name)
        self.events.append(Event("finished", name))
        return [self.events[-1], *self._schedule()]

    def usage(self, queue: str, flavor: str, without: Iterable[str] = ()) -> int:
        skip = set(without)
        return sum(
            w.slices
            for w in self.admitted.values()
            if w.queue == queue and w.flavor == flavor and w.name not in skip
        )

    # ------------------------------------------------------------------ rules
    def _cohort(self, queue: ClusterQueue) -> list[ClusterQueue]:
        if queue.cohort is None:
            return [queue]
        return [q for q in self.queues.values() if q.cohort == queue.cohort]

    def _fits(self, w: Workload, without: Iterable[str] = ()) -> bool:
        queue = self.queues[w.queue]
        quota = queue.quotas[w.flavor]
        skip = set(without)
        mine = self.usage(queue.name, w.flavor, skip) + w.slices
        if queue.cohort is None:
            return mine <= quota.nominal
        borrowed = mine - quota.nominal
        if quota.borrowing_limit is not None and borrowed > quota.borrowing_limit:
            return False
        members = [q for q in self._cohort(queue) if w.flavor in q.quotas]
        capacity = sum(q.quotas[w.flavor].lendable for q in members)
        used = 0
        for q in members:
            usage = mine if q is queue else self.usage(q.name, w.flavor, skip)
            used += max(0, usage - q.quotas[w.flavor].guaranteed)
        return used <= capacity

    def _borrowing(self, queue: str, flavor: str, without: Iterable[str]) -> bool:
        quota = self.queues[queue].quotas.get(flavor)
        return quota is not None and self.usage(queue, flavor, without) > quota.nominal

    def _candidates(self, w: Workload) -> list[Workload]:
        queue = self.queues[w.queue]
        within_nominal = (
            self.usage(queue.name, w.flavor) + w.slices <= queue.quotas[w.flavor].nominal
        )
        found = []
        for other in self.admitted.values():
            if other.flavor != w.flavor:
                continue
            if other.queue == w.queue:
                if self._within_victim(queue.within, other, w):
                    found.append(other)
                continue
            same_cohort = (
                queue.cohort is not None and self.queues[other.queue].cohort == queue.cohort
            )
            if not same_cohort or not within_nominal or queue.reclaim == "Never":
                continue
            if queue.reclaim == "LowerPriority" and other.priority >= w.priority:
                continue
            if self._borrowing(other.queue, w.flavor, ()):
                found.append(other)
        admitted_at = list(self.admitted)
        found.sort(key=lambda o: (o.queue == w.queue, o.priority, -admitted_at.index(o.name)))
        return found

    def _within_victim(self, policy: str, other: Workload, w: Workload) -> bool:
        if other.priority < w.priority:
            return policy != "Never"
        newer = self._order[other.name] > self._order[w.name]
        return policy == "LowerOrNewerEqualPriority" and other.priority == w.priority and newer

    def _victims(self, w: Workload) -> list[Workload] | None:
        removed: list[Workload] = []
        for candidate in self._candidates(w):
            gone = [r.name for r in removed]
            if candidate.queue != w.queue and not self._borrowing(candidate.queue, w.flavor, gone):
                continue  # that queue no longer borrows: it keeps the rest
            removed.append(candidate)
            if self._fits(w, [r.name for r in removed]):
                break
        else:
            return None
        for candidate in reversed(removed[:-1]):  # put back those not needed
            rest = [r.name for r in removed if r is not candidate]
            if self._fits(w, rest):
                removed.remove(candidate)
        return removed

    def _schedule(self) -> list[Event]:
        start = len(self.events)
        progress, rounds = True, 0
        while progress:
            progress, rounds = False, rounds + 1
            if rounds > 10_000:
                raise RuntimeError("the admission model did not settle (a preemption cycle)")
            ordered = sorted(
                self.pending.values(), key=lambda p: (-p.priority, self._order[p.name])
            )
            for w in ordered:
                if self._fits(w):
                    self._admit(w, "fits its quota" + self._borrow_note(w))
                    progress = True
                    break
                victims = self._victims(w)
                if victims:
                    for victim in victims:
                        del self.admitted[victim.name]
                        self.pending[victim.name] = victim
                        self.events.append(
                            Event(
                                "preempted",
                                victim.name,
                                f"by {w.name} (queue {w.queue}, priority {w.priority}): all "
                                f"{victim.slices} slice(s) of {victim.flavor} released",
                            )
                        )
                    self._admit(w, "after preemption" + self._borrow_note(w))
                    progress = True
                    break
        for w in self.pending.values():
            self.events.append(Event("pending", w.name, "waiting for quota"))
        return self.events[start:]

    def _borrow_note(self, w: Workload) -> str:
        quota = self.queues[w.queue].quotas[w.flavor]
        over = self.usage(w.queue, w.flavor) + w.slices - quota.nominal
        return f", borrowing {over} slice(s) from cohort" if over > 0 else ""

    def _admit(self, w: Workload, detail: str) -> None:
        del self.pending[w.name]
        self.events.append(Event("admitted", w.name, detail))
        self.admitted[w.name] = w


__all__ = ["RECLAIM", "WITHIN", "Cluster", "ClusterQueue", "Event", "Quota", "Workload"]
