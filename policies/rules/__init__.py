"""Pure policy rules: ``(props) -> list[str]`` per resource, ``(resources) -> list[str]`` per stack.

Each message starts with the field path it is about and says what is wrong, the numbers involved
and how to fix it. Every shape fact comes from :mod:`raytpu.catalog`.
"""
