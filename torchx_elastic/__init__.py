"""torchx-elastic: TorchX components, scheduler adapters and an elastic agent.

The worker-side API (``progress``, ``heartbeat``) lives in :mod:`torchx_elastic.worker`
and uses the standard library only, so importing this package from a training script
costs nothing.
"""

__version__ = "0.1.0"

from torchx_elastic.worker import heartbeat, progress

__all__ = ["__version__", "heartbeat", "progress"]
