"""Adaptive batching for one replica: a batch waits only while more requests are on their way.

Ray Serve's ``@serve.batch`` waits ``batch_wait_timeout_s`` for a batch to fill, so a lone request
pays the whole wait. Here a batch leaves as soon as one of these holds:

- it is full (``max_batch`` requests);
- every request the replica has admitted is queued (none is still being read or validated:
  waiting longer could only add requests that have not reached the replica yet), so a lone
  request waits 0;
- ``max_wait_s`` has passed since its first request was queued.

Batches run one at a time (the replica's accelerator runs one program at a time); requests that
arrive while one runs form the next, which leaves as soon as the running one ends. A batch
takes the oldest request's length bucket (``key``) and only requests of the same bucket, so
short prompts are not padded to the longest prompt's length; the others lead the next batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from raytpu.errors import invalid

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class Ticket:
    """An admitted request; ``queued`` once its item is in the queue."""

    queued: bool = False


@dataclass
class _Waiting(Generic[Item]):
    item: Item
    key: Any
    future: asyncio.Future
    queued_at: float


class AdaptiveBatcher(Generic[Item, Result]):
    """Batches of ``Item`` for ``run`` (one result per item, in order)."""

    def __init__(
        self,
        run: Callable[[list[Item]], Awaitable[list[Result]]],
        *,
        max_batch: int,
        max_wait_s: float,
        key: Callable[[Item], Any] = lambda item: 0,
        adaptive: bool = True,
    ) -> None:
        if max_batch < 1:
            raise ValueError(invalid("max_batch", max_batch, "an integer >= 1"))
        if max_wait_s < 0:
            raise ValueError(invalid("max_wait_s", max_wait_s, ">= 0 seconds"))
        self._run, self.max_batch, self.max_wait_s, self._key = run, max_batch, max_wait_s, key
        self.adaptive = adaptive
        """False: a batch leaves only when full or after ``max_wait_s`` (``@serve.batch``'s rule)."""
        self._queue: list[_Waiting[Item]] = []
        self._arriving = 0
        self._running = 0
        self._changed: asyncio.Event | None = None
        self._loop_task: asyncio.Task | None = None
        self.lock = asyncio.Lock()
        """Held while a batch runs; hold it to run anything else on the accelerator."""
        self.batches: list[int] = []
        """Sizes of the batches run so far (tests and ``describe``)."""

    @property
    def depth(self) -> int:
        """Requests admitted and not answered: arriving, queued and running."""
        return self._arriving + len(self._queue) + self._running

    @contextlib.contextmanager
    def admit(self) -> Iterator[Ticket]:
        """Around a request from its arrival until it is queued (or refused): while any admitted
        request is not yet queued, a forming batch may wait for it."""
        ticket = Ticket()
        self._arriving += 1
        try:
            yield ticket
        finally:
            if not ticket.queued:
                self._arriving -= 1
                self._poke()

    def enqueue(self, item: Item, ticket: Ticket) -> asyncio.Future:
        """Queue ``item`` (admitted with ``ticket``); the future resolves when its batch ran."""
        if ticket.queued:
            raise ValueError("ticket: already used; valid: one item per admitted request")
        self._ensure_loop()
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Waiting(item, self._key(item), future, time.monotonic()))
        ticket.queued = True
        self._arriving -= 1
        self._poke()
        return future

    async def submit(self, item: Item, ticket: Ticket) -> Result:
        """``item``'s result, once its batch has run."""
        return await self.enqueue(item, ticket)

    def _poke(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._changed = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def _ready(self) -> bool:
        if not self._queue:
            return False
        head = self._queue[0]
        same = sum(1 for w in self._queue if w.key == head.key)
        waited = time.monotonic() - head.queued_at
        nobody_coming = self.adaptive and self._arriving <= 0
        return same >= self.max_batch or nobody_coming or waited >= self.max_wait_s

    async def _loop(self) -> None:
        assert self._changed is not None
        while True:
            while not self._ready():
                self._changed.clear()
                timeout = None
                if self._queue:
                    timeout = max(
                        0.0, self.max_wait_s - (time.monotonic() - self._queue[0].queued_at)
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout)
            head = self._queue[0].key
            batch = [w for w in self._queue if w.key == head][: self.max_batch]
            self._queue = [w for w in self._queue if w not in batch]
            self._running += len(batch)
            try:
                async with self.lock:
                    results = await self._run([w.item for w in batch])
                for waiting, result in zip(batch, results, strict=True):
                    if not waiting.future.done():
                        waiting.future.set_result(result)
            except Exception as failure:  # every request of the batch gets the failure
                for waiting in batch:
                    if not waiting.future.done():
                        waiting.future.set_exception(failure)
            finally:
                self._running -= len(batch)
                self.batches.append(len(batch))
