"""Mycroft: real-time tracing and root-cause analysis for collective communication."""

__version__ = "0.1.0"
