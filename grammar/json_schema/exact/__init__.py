"""Exact languages for JSON Schema keywords the main builder would otherwise refuse: every
JSON spelling of a property name and its complement (`names`)."""
