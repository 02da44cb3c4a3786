"""JSON Schema as a language: normalisation and `$ref`, objects, arrays, strings, exact
numbers, formats, oneOf / not / if-then-else, merges of allOf, and the lark path for
recursive schemas. Builds on `grammar.automata` (and `grammar.cfg` for the lark path)."""
