"""``ray-tpu:notebooks``: the JupyterLab developer environments as frozen dataclasses (no parser
here, no import of :mod:`infra.config.schema`: it imports this module for ``StackConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

NOTEBOOK_PORT = 8888
"""JupyterLab's port in its pod (reached with ``kubectl port-forward``)."""


@dataclass(frozen=True)
class NotebookConfig:
    """One JupyterLab next to one RayCluster: a team's (with ``ray-tpu:teams``) or the stack's."""

    name: str
    """``<team>-notebook``, or ``notebook`` for the stack's one: the prefix of its objects."""
    namespace: str
    ray_cluster: str
    """The RayCluster its kernels attach to (Ray Client, token auth)."""
    team: str | None = None
    queue: str | None = None
    """The team's Kueue LocalQueue (named after the team) the notebook's RayJobs must name."""


@dataclass(frozen=True)
class NotebookIapConfig:
    """``ray-tpu:notebooks.iap``: every notebook on its own HTTPS host behind Identity-Aware
    Proxy, ``<notebook name>.<domain>`` (IAP first, then the Jupyter token)."""

    domain: str
    members: tuple[str, ...] = ()
    """IAM principals that pass IAP to every notebook of the stack."""
    team_members: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(team, principals): who passes IAP to that team's notebook, besides ``members``."""
    oauth_secret: str | None = None
    """A Secret (``client_id``, ``client_secret``) of a custom OAuth client in each notebook's
    namespace; None: IAP's Google-managed OAuth client (users of the organization only)."""

    def host(self, nb: NotebookConfig) -> str:
        return f"{nb.name}.{self.domain}"

    def members_of(self, nb: NotebookConfig) -> tuple[str, ...]:
        team = dict(self.team_members).get(nb.team or "", ())
        return tuple(dict.fromkeys((*self.members, *team)))


@dataclass(frozen=True)
class NotebooksConfig:
    """``ray-tpu:notebooks``: what every notebook runs, and the notebooks the stack declares."""

    notebooks: tuple[NotebookConfig, ...]
    image: str | None = None
    """The notebook container's image (None: the stack's Ray image, which must hold jupyterlab)."""
    cpu: str = "2"
    memory: str = "8Gi"
    iap: NotebookIapConfig | None = None
    """Each notebook also on an HTTPS host behind IAP (None: port-forward only)."""
