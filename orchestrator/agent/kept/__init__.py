"""A run its nodes keep (``up --detach``, ``--max-restarts``): the keeper as a
daemon (``daemon``), its attempts and the gang among the nodes (``keeper``),
the gang's TCP links (``peers``), when a restart would not help
(``restarts``), and its records, checked wherever read (``records``)."""
