"""Analysis passes: parameters, FLOPs, memory, KV cache, receptive field."""
