"""Compiler passes over the IR: canonical forms (`canonical`), classification of terms
(`classify`) and of simple constraint sets (`sets`), differentiation (`differentiate`), code
generation of flat evaluation plans (`codegen`), the owner split of a centrally written model
(`split`), the per-node merit functions (`merit`) and per-record gradients (`per_record`)."""
