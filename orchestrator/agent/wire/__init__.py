"""The agent's wire: framing and messages (``protocol``), the few lines that
receive the agent on a node (``bootstrap``), the request loop (``serve``) and
checked, atomic file transfer (``files``)."""
