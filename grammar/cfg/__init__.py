"""Context-free constraints from lark grammars: terminals as automata, a context-sensitive
lexer, an LALR parse stack, token masks per parser configuration, and the matcher.
Builds on `grammar.automata` and `grammar.tokens`."""
