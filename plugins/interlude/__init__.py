"""interlude."""
