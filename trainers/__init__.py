"""Training engines (FSDP2, Megatron): log-probs, updates, weight export, checkpoint state."""
