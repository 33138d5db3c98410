"""The plan layer: from a validated spec to frozen facts, and their renderings.

* ``model``    RunPlan / NodePlan / RankPlan / Entrypoint: what runs where
* ``build``    build_plan (pure) and resolve_plan (launch-time facts)
* ``torchrun`` the torchrun argv, built from the facts in one place
* ``dryrun``   DryRun / NodeLaunch: a backend's request, previewed and launched
* ``render``   text, json and shell renderings of a DryRun
* ``secrets``  masking of secret-looking values
"""
