"""The scheduler base: what every backend whose run is one scheduler job shares.
A scheduler backend (Slurm's, or one from outside the tree) fills in a few methods."""
