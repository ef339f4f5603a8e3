"""What a training script may call: ``progress(step, total)`` and ``heartbeat()``.

    from torchx_elastic import progress
    for step in range(total_steps):
        train_step()
        progress(step + 1, total_steps)

Under the torchx-elastic agent each call tells the agent how far this rank is (for the one
progress bar of the job and for the hang watchdog). Anywhere else (plain ``python``,
``torchrun``, a notebook) both are no-ops.

Standard library only. A call costs one ``time.monotonic()`` and a comparison: messages are
rate-limited here, and the ones that are sent are tiny non-blocking datagrams on the agent's
Unix socket (named by ``TORCHX_ELASTIC_CHANNEL``, where ``@name`` means Linux's abstract
namespace); a message that cannot be sent is dropped.
"""

from __future__ import annotations

import os
import time

from torchx_elastic.contract import CHANNEL_ENV, RESTART_COUNT_ENV

TYPE_CHECKING = False  # not typing's: importing typing would cost more than this module
if TYPE_CHECKING:
    import socket

PROGRESS_INTERVAL_S = 0.1
HEARTBEAT_INTERVAL_S = 0.5


class _Sender:
    """This process's end of the channel; inactive when not started by the agent."""

    def __init__(self) -> None:
        self.path = os.environ.get(CHANNEL_ENV, "")
        self.active = bool(self.path)
        self.local_rank = os.environ.get("LOCAL_RANK", "0")
        self.attempt = os.environ.get(RESTART_COUNT_ENV, "0")
        self.next_progress_s = 0.0
        self.next_heartbeat_s = 0.0
        self._socket: socket.socket | None = None
        if self.active:
            import atexit

            # "bye": the hang watchdog stops watching a rank whose script is done
            atexit.register(self.send, "b")

    def send(self, message: str) -> None:
        try:
            if self._socket is None:
                import socket  # here, not at the top: importing the package stays cheap

                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._socket.setblocking(False)
            self._socket.sendto(
                f"{message} {self.local_rank} {self.attempt}".encode(), socket_address(self.path)
            )
        except OSError:
            pass  # the agent is gone or busy: progress is best effort


def socket_address(path: str) -> str:
    """``@name`` (how an environment variable holds it) is Linux's abstract ``\\0name``."""
    return "\0" + path[1:] if path.startswith("@") else path


_sender: _Sender | None = None


def _get_sender() -> _Sender:
    global _sender
    if _sender is None:
        _sender = _Sender()
    return _sender


def progress(step: int, total: int | None = None) -> None:
    """Report that this rank finished ``step`` of ``total`` steps (also a heartbeat).

    Cheap enough to call every step: at most one message per ``PROGRESS_INTERVAL_S`` leaves
    the process, plus the last step (``step == total``) so the bar ends at 100%.
    """
    sender = _sender if _sender is not None else _get_sender()
    if not sender.active:
        return
    now_s = time.monotonic()
    if now_s < sender.next_progress_s and step != total:
        return
    sender.next_progress_s = now_s + PROGRESS_INTERVAL_S
    sender.next_heartbeat_s = now_s + HEARTBEAT_INTERVAL_S
    sender.send(f"p {int(step)} {-1 if total is None else int(total)}")


def heartbeat() -> None:
    """Tell the agent this rank is alive (for the hang watchdog), without a step count."""
    sender = _sender if _sender is not None else _get_sender()
    if not sender.active:
        return
    now_s = time.monotonic()
    if now_s < sender.next_heartbeat_s:
        return
    sender.next_heartbeat_s = now_s + HEARTBEAT_INTERVAL_S
    sender.send("h")
