"""Launching a Python function (not a script) as the workers: torch's ``elastic_launch``."""
