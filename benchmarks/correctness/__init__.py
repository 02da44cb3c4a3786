"""Correctness, not time: conformance on the official JSON-Schema-Test-Suite, soundness by
random generation, and the schema suites both walk."""
