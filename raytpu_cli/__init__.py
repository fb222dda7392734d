"""The ``raytpu`` command line: every subcommand, on top of every other package.

Layers, bottom to top: ``raytpu`` (the core: catalog, Ray names, version rules, job contract,
stack outputs; stdlib plus PyYAML/jsonschema) <- ``infra``, ``policies``, ``workloads`` <-
``raytpu_cli``. Nothing below imports this package.
"""
