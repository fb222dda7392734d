"""Pure builders of Kubernetes, KubeRay, Kueue and monitoring manifests: plain dicts, no Pulumi
import.
"""
