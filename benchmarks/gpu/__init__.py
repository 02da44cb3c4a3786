"""The engine on a lent GPU against transformers on the same device (`gpu_check.sh` at the
top of benchmarks/ runs it)."""
