"""A multi-node training job as one step of a pipeline.

- ``python -m torchx_elastic.pipelines``: submit to Kubernetes and wait, for any engine
  (``command.py``, ``step.py``); it imports no pipeline SDK.
- ``torchx_elastic.pipelines.kfp``: the same step as a Kubeflow Pipelines v2 component
  (the ``kfp`` extra).

See ``docs/pipelines.md``.
"""
