"""torch."""
