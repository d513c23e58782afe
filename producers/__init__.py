"""Trace sources and publishers: node agent, ring buffer, simulator."""
