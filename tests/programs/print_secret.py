"""Prints the secret it was given, as careless training scripts do, and with
--fail raises it in an exception, as careless error messages do."""
import os
import sys

token = os.environ["HF_TOKEN"]
print("token is", token, flush=True)
if "--fail" in sys.argv:
    raise RuntimeError(f"could not log in with {token}")
