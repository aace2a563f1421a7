"""The GPU benchmark suite behind ``benchmarks/gpu.py``: one module a job (device helpers, the
check-then-time harness, the kernel cases, GPT-2, the report)."""
