"""The local simulation of a GKE cluster of TPU slices: Ray nodes that stand in for TPU hosts, node
pools that come and go whole, and the GCS emulator. Imported by no other room of workloads.
"""
