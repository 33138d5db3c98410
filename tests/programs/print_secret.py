"""Prints the secret it was given, as careless training scripts do."""
import os

print("token is", os.environ["HF_TOKEN"], flush=True)
