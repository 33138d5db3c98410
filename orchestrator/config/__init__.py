"""The config layer: a cluster file (YAML) becomes a validated, frozen ``ClusterSpec``.

* ``yamlsrc``   YAML nodes that keep their lines, for messages
* ``loader``    field-by-field validation with paths, lines and hints
* ``spec``      the ``*Spec`` types: user input after validation
* ``schema``    the same rules as JSON Schema, for editors
* ``localmode`` the one-node spec of ``up --local``
"""
