"""A project-shaped package for the tests: what real training code looks like."""
