"""Prefill-decode disaggregation: a prefill server hands each request's KV to a decode server.

`modes` is what the engine's `disaggregation_mode` changes, `sender` / `receiver` the two ends
of the bootstrap-port protocol (`protocol`), page bytes come from `runtime.memory.kv_pages`.
"""
