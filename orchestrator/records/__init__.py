"""Run records on the controller: the run directory, states and outcomes.

* ``rundir``  the local run directory and run ids
* ``runsdir`` which runs directory, from wherever a command runs
* ``outcome`` RunState / NodeState, NodeOutcome / RunOutcome, the root cause
* ``store``   state.json, written and read in this one place
"""
