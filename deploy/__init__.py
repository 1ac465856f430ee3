"""GPU-host deployment tools; `python -m deploy.wheelhouse` runs from the repository root."""
