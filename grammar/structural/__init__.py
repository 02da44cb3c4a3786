"""Structural tags: free text until a trigger, then a tagged, constrained region."""
