"""Whole TPU slices for Ray: reserve all hosts of a slice or none, and release what a reservation
held.
"""
