"""Training on TPU slices: the driver, the worker loop every model family runs, its config,
multislice, goodput (watchdog, spikes, slow hosts), fault injection, recovery and tiered
checkpoints.
"""
