"""Worker processes: starting, piping, stopping, and the bootstrap each worker runs first.

Imports nothing: ``python -m torchx_elastic.agent.workers.bootstrap`` (every worker's first
code) and ``python -m torchx_elastic.agent.workers.janitor`` stay cheap.
"""
