"""Repository tools; the Python ones run from the repository root as `python -m tools.NAME`."""
