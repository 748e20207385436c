"""Events (and, later, metrics) of every component."""
