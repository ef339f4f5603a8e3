"""What the user sees, by what it is for: ``output/`` (prefixed worker lines, the live bar or
plain status lines), ``progress/`` (the worker -> agent channel, the node's summary, the
exchange across nodes), ``failure/`` (the job's first failure, the root-cause report);
``session.py`` wires them together for one agent run."""
