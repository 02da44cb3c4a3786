"""The HTTP server and clusters under load: concurrency, structured output, tool calls,
prefill-decode disaggregation, cache-aware routing and the hierarchical cache."""
