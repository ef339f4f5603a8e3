"""The bundled elastic agent: ``python -m torchx_elastic.agent``.

Imports torch and the standard library only (never torchx, docker or kubernetes): it runs
in every training image and its start-up is on every job's critical path. This package's
``__init__`` imports nothing so the worker bootstrap stays cheap.
"""
