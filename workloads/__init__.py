"""JAX/Ray workloads for TPU slices, one room per concern.

=========================  ==============================================================
Room                       What lives there
=========================  ==============================================================
``workloads.slices``       reserving whole TPU slices (all hosts or none), releasing them
``workloads.sim``          the local cluster whose Ray nodes simulate TPU hosts (tests, CLI)
``workloads.model``        model families (byte LM, Llama presets), sharding, checkpoints
``workloads.data``         the shipped corpus and the presets' text pipeline
``workloads.training``     the driver, the one worker loop, goodput, faults, recovery
``workloads.serving``      the Serve app, its routes, requests, OpenAI API, fallback
``...serving.engine``      batched decode, the prefill plan, the prefix-reusing KV cache
=========================  ==============================================================

Shared by the rooms: :mod:`workloads.telemetry` (slice metrics and the error taxonomy) and
:mod:`workloads.storage` (checkpoint URIs). :mod:`workloads.serve` is the import path the stack's
RayService names (``workloads.serve:app``). ``workloads.sim`` is imported by no other room: what
runs on GKE never depends on the simulation. Heavy imports (ray, jax, flax) live in the
submodules, never here.
"""
