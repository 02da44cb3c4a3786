"""Regular languages over bytes: regex syntax trees (and ECMA-262 `pattern` parsing), the NFA
with UTF-8 character classes, eager and lazy DFAs, products, differences and intersections.
The bottom layer of `grammar`: imports nothing of it but `grammar.errors`."""
