"""opcollect: operator-performance tables for LLM serving simulators."""

__version__ = "0.1.0"
