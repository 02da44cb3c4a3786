"""GBNF / EBNF grammars (llama.cpp's and XGrammar's dialect) as token constraints."""
