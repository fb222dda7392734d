"""The serving engine of one replica: the engine, the decode loops, the prefill plan and the prefix
cache.
"""
