"""Compiler passes: differentiation, code generation, owner split, canonicalization, merit functions."""
