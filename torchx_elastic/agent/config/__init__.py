"""The agent's command line (torchrun's flags and ours) and what it is parsed into."""
