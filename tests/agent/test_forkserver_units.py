"""The fork server ends quietly when its agent is killed (a second Ctrl-C kills the job's
processes at once): the agent's end of the socket then resets instead of ending where a
message of the server's (a worker's exit) was still unread, and the server must not print
a traceback into the job's output."""

from __future__ import annotations

import array
import json
import os
import select
import socket
from pathlib import Path

import pytest

from torchx_elastic.agent.workers import forkserver


def _start_server() -> tuple[socket.socket, int]:
    """A fork server on a socket pair, as ``ForkServer`` makes it (without its reader
    thread: the test reads, or does not, what the server says)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        code = 0
        try:
            forkserver.serve(theirs, script_workers=True, compiler=False)
        except BaseException:  # noqa: BLE001 - as ForkServer: said, then exit 1
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    theirs.close()
    return ours, pid


@pytest.mark.timeout(120)
def test_a_server_whose_agent_was_killed_with_an_exit_unread_ends_quietly(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "quick.py").write_text("pass\n")
    agent, server = _start_server()
    out = os.open(os.devnull, os.O_WRONLY)
    request = {
        "argv": ["quick.py"],
        "env": {"PATH": os.environ.get("PATH", "")},
        "cwd": str(tmp_path),
    }
    agent.sendmsg(
        [json.dumps(request).encode()],
        [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [out, out]))],
    )
    os.close(out)
    started = json.loads(agent.recv(1 << 16))
    assert "started" in started
    # the worker's exit comes next: the agent is killed before it reads it
    readable, _, _ = select.select([agent], [], [], 60)
    assert readable, "the server said nothing of its worker's exit"
    agent.close()
    _, status = os.waitpid(server, 0)
    err = capfd.readouterr().err
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, err
    assert "Traceback" not in err, err


def test_the_reset_is_what_a_killed_agent_leaves() -> None:
    """The premise, on this kernel: a peer closed with a message unread resets the socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.send(b"exited")
    ours.close()
    with pytest.raises(ConnectionResetError):
        theirs.recvmsg(64)
