"""Pure policy rules: ``(props) -> list[str]`` per resource, ``(resources) -> list[str]`` per stack.

Each message starts with the field path it is about and says what is wrong, the numbers involved
and how to fix it. Every shape fact comes from :mod:`raytpu.catalog`.
"""

from __future__ import annotations


class Advisory(str):
    """A rule message about a risk, not a broken resource: the object works as written, but
    something is worth changing (a likely perpetual diff, a form Kubernetes fills in for you).

    Reported at advisory level even when its policy is mandatory, under the companion policy
    ``<policy>-advisory`` (see :mod:`policies.pack`): it never fails ``raytpu check``/``preview``
    or ``pulumi preview`` unless policy config raises that companion to mandatory.
    """

    __slots__ = ()


__all__ = ["Advisory"]
