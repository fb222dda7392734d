"""Batch inference on reserved TPU slices: a dataset of prompts through the serving engine with
Ray Data, one actor per whole host of a reserved slice, results written as files exactly once
(:mod:`workloads.batch.files`, :mod:`workloads.batch.predictor`, :mod:`workloads.batch.job`).
"""
