"""Run records on the controller: the run directory and ids (``rundir``), which
runs directory (``runsdir``), states and outcomes (``outcome``), state.json (``store``).
"""
