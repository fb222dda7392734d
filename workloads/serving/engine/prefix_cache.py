"""Prefix cache: the KV blocks of shared prompt prefixes, in three tiers, shared between replicas.

Glossary (vLLM's automatic prefix caching, in Ray's words):

- **block**: ``BLOCK_TOKENS`` consecutive prompt tokens and their keys/values in every layer
  (:func:`workloads.serving.engine.decode.read_block`). Only full blocks are cached.
- **block hash**: a hash chain, ``h[i] = sha256(h[i-1] || tokens of block i)``, seeded with the
  model's identity (:func:`block_hashes`): equal hashes mean an equal prefix *and* an equal model,
  so a block is reusable wherever its hash is found.
- **tiers**: device (the replica's accelerator memory), host (the replica's RAM) and shared (Ray's
  object store: a block one replica computed, put there and owned by the
  :class:`PrefixDirectory` actor, found by every replica through that directory). Each tier is an LRU with its own bound
  (:class:`LRUTier`); a block evicted from the device tier drops to the host tier.
- **hit**: a prompt's leading blocks found in some tier are written into its cache row and its
  prefill starts after them (``start > 0``): those tokens are not computed again.

The last prompt token is never served from the cache: its logits start decoding.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raytpu.errors import invalid

BLOCK_TOKENS = 16
DEVICE_BLOCKS = 512
"""Default device-tier bound: 512 blocks of 16 tokens (8192 tokens of KV)."""
HOST_BLOCKS = 4096
SHARED_BLOCKS = 16384
DIRECTORY_NAME = "raytpu_prefix_directory"
DIRECTORY_NAMESPACE = "raytpu"
LOOKUP_TIMEOUT_S = 2.0
"""A shared-tier lookup or fetch slower than this counts as a miss (prefill runs instead)."""
TIERS = ("device", "host", "shared")


def block_hashes(
    model_tag: str, ids: Sequence[int], block: int = BLOCK_TOKENS, limit: int | None = None
) -> list[str]:
    """The hash of every full block of ``ids`` (at most ``limit`` tokens' worth)."""
    if block < 1:
        raise ValueError(invalid("block", block, "an integer >= 1"))
    usable = len(ids) if limit is None else min(len(ids), limit)
    tokens = np.asarray(ids, np.int32)
    previous = hashlib.sha256(model_tag.encode()).digest()
    hashes = []
    for begin in range(0, usable - block + 1, block):
        previous = hashlib.sha256(previous + tokens[begin : begin + block].tobytes()).digest()
        hashes.append(previous.hex()[:32])
    return hashes


class LRUTier:
    """A bounded map, least recently used out first. :meth:`put` returns what it evicted."""

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(invalid(f"{name} capacity", capacity, ">= 0 blocks"))
        self.name, self.capacity = name, capacity
        self._items: OrderedDict[str, Any] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: str) -> Any | None:
        if key not in self._items:
            return None
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key: str, value: Any) -> list[tuple[str, Any]]:
        self._items[key] = value
        self._items.move_to_end(key)
        evicted = []
        while len(self._items) > self.capacity:
            evicted.append(self._items.popitem(last=False))
        return evicted


class PrefixDirectory:
    """The shared tier's index (a named Ray actor): block hash -> ObjectRef of the block, LRU
    bounded. It puts the blocks it is sent itself, so it owns them and they outlive the replica
    that computed them; evicting a hash drops the last reference and frees the object."""

    def __init__(self, capacity: int = SHARED_BLOCKS) -> None:
        self._tier = LRUTier("shared", capacity)
        # The actor serves several calls at once (max_concurrency): a lookup must not see half
        # of a publish (a prefix cut short) nor the LRU map while another call reorders it.
        self._lock = threading.Lock()

    def lookup(self, hashes: list[list[str]]) -> list[list[Any]]:
        """For each row of hashes: the refs of its longest run of known blocks from the start
        (each wrapped in a list, so that Ray passes the ref and not the value)."""
        found = []
        with self._lock:
            for row in hashes:
                refs = []
                for key in row:
                    ref = self._tier.get(key)
                    if ref is None:
                        break
                    refs.append([ref])
                found.append(refs)
        return found

    def publish(self, blocks: dict[str, Any]) -> int:
        """Keep ``blocks`` (hash -> array) in the object store, put here so that this actor
        owns them; all of them become visible at once. Returns how many blocks it holds."""
        import ray

        with self._lock:
            new = [key for key in blocks if key not in self._tier]
        refs = {key: ray.put(blocks[key]) for key in new}  # the slow part, outside the lock
        with self._lock:
            for key, ref in refs.items():
                if key not in self._tier:
                    self._tier.put(key, ref)
            return len(self._tier)

    def size(self) -> int:
        with self._lock:
            return len(self._tier)


def directory(capacity: int = SHARED_BLOCKS, name: str = DIRECTORY_NAME) -> Any:
    """The cluster's one :class:`PrefixDirectory` (created by the first replica that asks;
    detached, so it outlives any one replica)."""
    import ray

    return (
        ray.remote(PrefixDirectory)
        .options(
            name=name,
            namespace=DIRECTORY_NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=8,
        )
        .remote(capacity)
    )


@dataclass
class Counts:
    """Block hits per tier and misses (blocks a prompt had to prefill), since the replica began."""

    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    misses: int = 0
    skipped_tokens: int = 0

    def add(self, other: Counts) -> None:
        for tier, hits in other.hits.items():
            self.hits[tier] += hits
        self.misses += other.misses
        self.skipped_tokens += other.skipped_tokens

    def to_dict(self) -> dict[str, Any]:
        return {
            "hits": dict(self.hits),
            "misses": self.misses,
            "skipped_tokens": self.skipped_tokens,
        }


@dataclass(frozen=True)
class PrefixHit:
    """One row's prefix-cache hit: the prompt tokens its cache row got from the cache (its
    prefill starts there) and the tier of its last hit block (``""``: no hit)."""

    start: int = 0
    tier: str = ""


@dataclass(frozen=True)
class LoadedPrefix:
    """A fresh cache with each row's hit blocks written in, and each row's hit."""

    kv: Any
    hits: tuple[PrefixHit, ...]

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(hit.start for hit in self.hits)


class PrefixCache:
    """One replica's view: device and host tiers, and the shared directory if there is one.

    :meth:`load` writes the hit blocks of each row into a fresh cache and returns where each
    row's prefill starts; :meth:`store` keeps the full blocks a prefill computed.
    """

    def __init__(
        self,
        cfg: Any,
        model_tag: str,
        *,
        device_blocks: int = DEVICE_BLOCKS,
        host_blocks: int = HOST_BLOCKS,
        shared: Any | None = None,
        block: int = BLOCK_TOKENS,
        on_counts: Any | None = None,
    ) -> None:
        self.cfg, self.tag, self.block = cfg, model_tag, block
        self.device = LRUTier("device", device_blocks)
        self.host = LRUTier("host", host_blocks)
        self.shared = shared
        self.counts = Counts()
        self._on_counts = on_counts

    def _hashes(self, ids: np.ndarray) -> list[str]:
        return block_hashes(self.tag, ids, self.block, limit=len(ids) - 1)

    def _local(self, key: str) -> tuple[str, Any] | None:
        found = self.device.get(key)
        if found is not None:
            return "device", found
        found = self.host.get(key)
        if found is not None:
            return "host", found
        return None

    def _fetch_shared(self, wanted: list[list[str]]) -> list[list[Any]]:
        import ray

        if self.shared is None or not any(wanted):
            return [[] for _ in wanted]
        try:
            refs = ray.get(self.shared.lookup.remote(wanted), timeout=LOOKUP_TIMEOUT_S)
            return [ray.get([r[0] for r in row], timeout=LOOKUP_TIMEOUT_S) for row in refs]
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return [[] for _ in wanted]  # the shared tier is an optimisation: prefill instead

    def load(self, kv: Any, ids: Sequence[np.ndarray]) -> LoadedPrefix:
        """``kv`` with each row's cached leading blocks written in, and each row's hit."""
        from workloads.serving.engine import decode

        hashes = [self._hashes(row) for row in ids]
        local: list[list[tuple[str, Any]]] = []
        for row in hashes:
            hits = []
            for key in row:
                found = self._local(key)
                if found is None:
                    break
                hits.append(found)
            local.append(hits)
        remote = self._fetch_shared(
            [row[len(hit) :] for row, hit in zip(hashes, local, strict=True)]
        )
        hits_by_row, counts = [], Counts()
        for row, (keys, hits, extra) in enumerate(zip(hashes, local, remote, strict=True)):
            blocks = [*hits, *[("shared", value) for value in extra]]
            for index, (tier, value) in enumerate(blocks):
                kv = decode.write_block(self.cfg, kv, value, row, index * self.block)
                counts.hits[tier] += 1
                if tier != "device":
                    self._keep(keys[index], _on_device(value))
            counts.misses += len(keys) - len(blocks)
            counts.skipped_tokens += len(blocks) * self.block
            tier = blocks[-1][0] if blocks else ""
            hits_by_row.append(PrefixHit(len(blocks) * self.block, tier))
        self.counts.add(counts)
        if self._on_counts is not None:
            self._on_counts(counts)
        return LoadedPrefix(kv, tuple(hits_by_row))

    def store(self, kv: Any, ids: Sequence[np.ndarray], starts: Sequence[int]) -> int:
        """Keep every full prompt block a prefill computed (those past each row's start) in the
        device tier and publish it to the shared tier; returns how many were new."""
        import jax

        from workloads.serving.engine import decode

        published: dict[str, Any] = {}
        for row, (seq, start) in enumerate(zip(ids, starts, strict=True)):
            keys = block_hashes(self.tag, seq, self.block)
            for index in range(start // self.block, len(keys)):
                if keys[index] in self.device:
                    continue
                value = decode.read_block(self.cfg, kv, row, index * self.block, self.block)
                self._keep(keys[index], value)
                published[keys[index]] = value
        if published and self.shared is not None:
            host = jax.device_get(list(published.values()))
            # Fire and forget: a lookup before the directory has them misses (and prefills).
            self.shared.publish.remote(dict(zip(published, host, strict=True)))
        return len(published)

    def _keep(self, key: str, value: Any) -> None:
        for old_key, old_value in self.device.put(key, value):
            self.host.put(old_key, np.asarray(old_value))


def _on_device(value: Any) -> Any:
    """A block as the device tier keeps it: a device array (host and shared blocks are numpy)."""
    import jax.numpy as jnp

    return jnp.asarray(value)
