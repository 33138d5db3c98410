"""What the user reads: the end-of-run summary, run listings, ``compare``'s report."""
