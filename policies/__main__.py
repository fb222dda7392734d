"""The ray-tpu policy pack for ``pulumi preview --policy-pack policies``.

Only builds the PolicyPack from the data in :mod:`policies.pack` (via :mod:`policies.adapter`).
Do not import this module: the PolicyPack constructor starts the analyzer server and blocks.
Every policy is mandatory unless ``--policy-pack-config`` says otherwise; see docs/policies.md.
"""

from pulumi_policy import EnforcementLevel, PolicyPack

from policies.adapter import build_policies

PolicyPack(
    name="ray-tpu",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=build_policies(),
)
