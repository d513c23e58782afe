"""Chunk-level cluster simulator with labelled fault injection."""
