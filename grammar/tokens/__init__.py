"""Automata meet a tokenizer: the byte vocabulary, per-state token masks (`TokenIndex`), the
compiled grammar with its matcher (mask / advance / forced text), and the compile cache.
Builds on `grammar.automata`."""
