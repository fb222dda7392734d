"""``raytpu`` subcommands owned by the workloads: ``demo``, ``train``, ``serve``."""
