"""sgl_dsl package (see README.md and ../shared/DESIGN.md)."""
