"""Model families (the byte LM, the Llama presets), their sharding over a slice's mesh, and their
checkpoints.
"""
