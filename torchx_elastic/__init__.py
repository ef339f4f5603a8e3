"""torchx-elastic: TorchX components, scheduler adapters and an elastic agent.

The worker-side API (``progress``, ``heartbeat``) lives in :mod:`torchx_elastic.worker`
and uses the standard library only, so importing this package from a training script
costs nothing. ``torchx_elastic.launch(fn, *args, nproc_per_node=N)`` runs a function on N
workers (:mod:`torchx_elastic.launcher`, imported on first use). A worker that raises
``torchx_elastic.NotRetried`` or exits with ``torchx_elastic.NOT_RETRIED_EXIT_CODE`` ends the
job without a restart (:mod:`torchx_elastic.contract.not_retried`).
"""

# the package's one version: pyproject.toml reads it from here ([tool.hatch.version]), and so
# the wheel's metadata; CHANGELOG.md says what changed
__version__ = "0.2.0"

from torchx_elastic.worker import heartbeat, progress

__all__ = ["NOT_RETRIED_EXIT_CODE", "NotRetried", "__version__", "heartbeat", "launch", "progress"]

TYPE_CHECKING = False  # not typing's: importing typing would cost a training script
if TYPE_CHECKING:
    from torchx_elastic.contract.not_retried import NOT_RETRIED_EXIT_CODE, NotRetried
    from torchx_elastic.launcher import launch


def __getattr__(name: str) -> object:
    """``torchx_elastic.launch``, imported on first use (it imports torch), and what ends a job
    without a restart."""
    if name == "launch":
        from torchx_elastic.launcher import launch

        return launch
    if name in ("NotRetried", "NOT_RETRIED_EXIT_CODE"):
        from torchx_elastic.contract import not_retried

        return getattr(not_retried, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
