"""The plan layer: from a validated spec to frozen facts, and their renderings."""
