"""The engine in process: prefix caching, models, kernels, KV dtypes, MLA, parallelism,
constrained decoding with jump-forward and DSL programs."""
