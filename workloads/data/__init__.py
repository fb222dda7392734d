"""Training data: the shipped corpus (corpus.txt) and the presets' tokenized per-host text
pipeline.
"""
