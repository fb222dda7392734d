"""Pulumi entry point (``pulumi up`` runs this): read the stack config, declare the stack."""

from infra.config.pulumi_config import from_pulumi
from infra.program import declare

declare(from_pulumi())
