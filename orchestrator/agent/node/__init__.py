"""One node's run: torchrun's supervisor and what it needs on the node."""
