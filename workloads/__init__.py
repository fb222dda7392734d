"""JAX/Ray workloads for TPU slices: slice reservation, training, serving, local slice simulation.

Heavy imports (ray, jax, flax) live in the submodules, never here.
"""
