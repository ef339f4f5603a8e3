"""Scheduler adapters: local_cwd, docker, kubernetes."""
