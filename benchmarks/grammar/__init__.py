"""Grammar engines timed side by side: ours vs XGrammar, llguidance and outlines-core on JSON
Schema suites, structural tags, GBNF and lark grammars."""
