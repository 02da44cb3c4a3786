"""Serving requests: the request and its result types, the scheduler's loop (admission by cached
prefix, chunked prefill, preemption), each step's plan and batch, sampling, constrained
decoding with jump-forward, and the outputs and streams handed back."""
