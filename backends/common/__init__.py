"""What the CPU and CUDA code generators share (neither imports the other)."""
