"""The agent's run: rendezvous, start, monitor, restart, stop, exit code."""
