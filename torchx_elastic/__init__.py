"""torchx-elastic: TorchX components, scheduler adapters and an elastic agent.

The worker-side API (``progress``, ``heartbeat``) lives in :mod:`torchx_elastic.worker`
and uses the standard library only, so importing this package from a training script
costs nothing. ``torchx_elastic.launch(fn, *args, nproc_per_node=N)`` runs a function on N
workers (:mod:`torchx_elastic.launcher`, imported on first use).
"""

__version__ = "0.1.0"

from torchx_elastic.worker import heartbeat, progress

__all__ = ["__version__", "heartbeat", "launch", "progress"]

TYPE_CHECKING = False  # not typing's: importing typing would cost a training script
if TYPE_CHECKING:
    from torchx_elastic.launcher import launch


def __getattr__(name: str) -> object:
    """``torchx_elastic.launch``, imported on first use (it imports torch)."""
    if name == "launch":
        from torchx_elastic.launcher import launch

        return launch
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
