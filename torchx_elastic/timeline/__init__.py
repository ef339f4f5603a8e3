"""``torchx-elastic timeline``: what happened to a job, drawn from the agents' files.

``source.py`` finds the records (log directory or app handle: ``log_dir.py`` reads a
directory, ``docker_source.py`` and ``kubernetes_source.py`` a job's containers or pods),
``model.py`` builds the timeline, ``failures.py`` names each attempt's root cause and
victims, ``html.py`` writes the self-contained page and ``trace.py`` the Chrome Trace Event
JSON.
"""
