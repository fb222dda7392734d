"""A preset's decoding for a Serve replica: :class:`Sampler`, the family's decode step
(:meth:`workloads.model.family.ModelFamily.next_logits`) with no KV cache, and the engine's own
token rule (:func:`workloads.serving.engine.decode.pick`: ``PRNGKey(seed)``, one ``split`` per new
token, temperature 0 greedy). The byte LM is served by the KV-cached engine instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jax
import numpy as np

from workloads.model.family import ModelFamily
from workloads.serving.engine.decode import pick


@dataclass(frozen=True, eq=False)
class Sampler:
    """Greedy (temperature 0) or temperature sampling with a family's decode step: every new
    token runs the last ``width`` tokens again, right-padded to ``width`` (one compiled program
    for every length)."""

    family: ModelFamily
    params: Any
    width: int

    @cached_property
    def _step(self) -> Any:
        return jax.jit(self.family.next_logits)

    def complete(self, prompt: str, max_new_tokens: int, temperature: float, seed: int) -> str:
        """``max_new_tokens`` new tokens after ``prompt``, as text."""
        key = jax.random.PRNGKey(seed)
        temps = np.asarray([temperature], np.float32)
        ids, new = self.family.encode(prompt) or [0], []
        for _ in range(max_new_tokens):
            window = (ids + new)[-self.width :]
            tokens = np.zeros((1, self.width), np.int32)
            tokens[0, : len(window)] = window
            lengths = np.asarray([len(window)], np.int32)
            key, sub = jax.random.split(key)
            new.append(int(pick(self._step(self.params, tokens, lengths), temps, sub)[0]))
        return self.family.decode(new)

    def describe(self) -> dict[str, Any]:
        """Where it computes: the local devices, and the devices every parameter is on."""
        devices = {len(leaf.sharding.device_set) for leaf in jax.tree.leaves(self.params)}
        return {
            "local_devices": [str(d) for d in jax.local_devices()],
            "param_devices": sorted(devices),
            "context_len": self.width,
            "family": self.family.name,
            "model": getattr(self.family.config, "name", ""),
        }
