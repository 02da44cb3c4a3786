"""grammar package (see README.md and ../shared/DESIGN.md)."""
