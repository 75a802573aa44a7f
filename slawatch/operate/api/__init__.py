"""The admin API's routes, a router per resource; :func:`slawatch.operate.admin.create_app`
wires them to the shared parts (the request gate, the database, the clock).

``health`` (``/healthz``, ``/readyz``, ``/metrics``), ``rules``, ``alerts`` (with
stats and replay), ``actions``, ``reports``, ``acks``, ``silences``, ``events`` and
``page`` (the on-call page and its login); ``context`` is what they are all given."""
