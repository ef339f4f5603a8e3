"""Console pieces without processes: line assembly, sinks, filters, status lines."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from torchx_elastic.agent.console.output.display import (
    PlainConsole,
    parse_rank_filter,
    wants_live,
)
from torchx_elastic.agent.console.output.sinks import (
    MAX_LINE_BYTES,
    LineAssembler,
    RankOutput,
    RankSink,
    SinkOptions,
    Stream,
    format_prefix,
    visible,
)
from torchx_elastic.agent.console.progress.channel import RankActivity
from torchx_elastic.contract.agent_args import ConsoleMode
from torchx_elastic.contract.log_layout import NodeLogs


class RecordingConsole:
    def __init__(self) -> None:
        self.shown: list[tuple[str, int, bytes]] = []
        self.transients: list[tuple[int, Stream, list[bytes]]] = []
        self.terminal = None
        self.attempts: list[tuple[int, dict[int, int]]] = []

    def start_attempt(self, node_rank: int, global_ranks: dict[int, int]) -> None:
        self.attempts.append((node_rank, global_ranks))

    def lines(self, stream: Stream, rank: int, prefix: bytes, lines: list[bytes]) -> None:
        self.shown += [(stream, rank, prefix + line) for line in lines]

    def transient(self, rank: int, stream: Stream, prefix: bytes, rows: list[bytes]) -> None:
        self.transients.append((rank, stream, rows))

    def close(self) -> None:
        pass


def outputs(tmp_path: Path, n: int = 2, node: int = 1, first_rank: int = 4) -> list[RankOutput]:
    return [
        RankOutput(
            local_rank=i,
            global_rank=first_rank + i,
            node_rank=node,
            stdout_path=NodeLogs(str(tmp_path)).rank_stdout(0, first_rank + i),
            stderr_path=NodeLogs(str(tmp_path)).rank_stderr(0, first_rank + i),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        (b"plain", b"plain"),
        (b"10%\r20%\r30%", b"30%"),
        (b"windows\r", b"windows"),
        (b"a\rb\r", b"b"),
        (b"", b""),
    ],
)
def test_visible_is_what_a_terminal_shows(line: bytes, shown: bytes) -> None:
    assert visible(line) == shown


def test_assembler_holds_partial_lines_until_complete() -> None:
    assembler = LineAssembler()
    assert assembler.feed(b"hel") == ([], None)
    assert assembler.feed(b"lo\nwor") == ([b"hello"], None)
    assert assembler.feed(b"ld\n\nlast") == ([b"world", b""], None)
    assert assembler.flush() == b"last"
    assert assembler.flush() is None


def test_assembler_carriage_returns_give_one_line_and_a_transient() -> None:
    assembler = LineAssembler()
    assert assembler.feed(b" 10%|#") == ([], None)
    assert assembler.feed(b"\r 50%|####") == ([], b" 50%|####")
    assert assembler.feed(b"\r") == ([], b" 50%|####")
    assert assembler.feed(b"\n") == ([b" 50%|####"], None)
    assert assembler.feed(b"a\rb\r") == ([], b"b")
    assert assembler.feed(b"c\n") == ([b"c"], None)


def test_assembler_splits_a_runaway_line() -> None:
    assembler = LineAssembler()
    lines, _ = assembler.feed(b"x" * (MAX_LINE_BYTES + 1))
    assert lines == [b"x" * (MAX_LINE_BYTES + 1)]
    assert assembler.flush() is None


def test_sink_prefixes_lines_and_files_keep_raw_bytes(tmp_path: Path) -> None:
    console = RecordingConsole()
    options = SinkOptions("[{role} n{node} r{rank} l{local_rank}] ", role="trainer")
    sink = RankSink(outputs(tmp_path), console, options)
    sink.feed(0, "stdout", b"a\r")
    sink.feed(1, "stderr", b"oops\n")
    sink.feed(0, "stdout", b"b\npart")
    sink.end(0, "stdout")
    sink.end(0, "stderr")
    sink.close()
    assert console.attempts == [(1, {0: 4, 1: 5})]
    assert console.shown == [
        ("stderr", 5, b"[trainer n1 r5 l1] oops"),
        ("stdout", 4, b"[trainer n1 r4 l0] b"),
        ("stdout", 4, b"[trainer n1 r4 l0] part"),
    ]
    assert Path(NodeLogs(str(tmp_path)).rank_stdout(0, 4)).read_bytes() == b"a\rb\npart"
    assert Path(NodeLogs(str(tmp_path)).rank_stderr(0, 5)).read_bytes() == b"oops\n"
    assert set(sink.ended_at) == {0}


def test_rank_filter_and_tee_limit_the_console_not_the_files(tmp_path: Path) -> None:
    console = RecordingConsole()
    sink = RankSink(outputs(tmp_path), console, SinkOptions(tee=2, show_ranks={5}))
    for local_rank in (0, 1):
        for stream in ("stdout", "stderr"):
            sink.feed(local_rank, stream, f"{stream} {local_rank}\n".encode())  # type: ignore[arg-type]
    sink.close()
    assert console.shown == [("stderr", 5, b"[n1 r5] stderr 1")]
    assert Path(NodeLogs(str(tmp_path)).rank_stdout(0, 4)).read_bytes() == b"stdout 0\n"
    assert Path(NodeLogs(str(tmp_path)).rank_stderr(0, 4)).read_bytes() == b"stderr 0\n"


def test_bad_prefix_template_says_which_fields_exist() -> None:
    with pytest.raises(ValueError) as err:
        format_prefix("[{host}] ", node=0, rank=0, local_rank=0)
    assert str(err.value) == (
        "--log-line-prefix-template '[{host}] ' is not valid (KeyError: 'host');"
        " use the fields {node}, {rank}, {local_rank}, {role}, {hostname},"
        " e.g. '[n{node} r{rank}] ', or torchrun's ${role_name}, ${rank}, ${local_rank},"
        " ${hostname}"
    )


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("all", None), ("", None), ("0", {0}), ("0,2-4", {0, 2, 3, 4}), (" 1 , 3 ", {1, 3})],
)
def test_rank_filter(text: str, ranks: set[int] | None) -> None:
    assert parse_rank_filter(text) == (None if ranks is None else frozenset(ranks))


@pytest.mark.parametrize("text", ["x", "3-1", "1-", "-2"])
def test_bad_rank_filter_says_what_is_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a rank or a range LOW-HIGH; expected e.g. 0 or"):
        parse_rank_filter(text)


def test_plain_console_writes_lines_and_a_status_line_when_progress_moves() -> None:
    clock = iter(float(t) for t in range(100))
    activity = RankActivity(clock=lambda: next(clock))
    out, err = io.BytesIO(), io.BytesIO()
    console = PlainConsole(activity, out, err, status_interval_s=0)  # no thread: driven by hand
    console.start_attempt(0, {0: 0, 1: 1})
    console.lines("stdout", 0, b"[n0 r0] ", [b"one", b"two"])
    console.print_status()
    assert err.getvalue() == b""  # no progress reported: no status line
    activity.progress(0, 0, 10, 100)
    activity.progress(1, 0, 5, 100)
    activity.progress(1, 0, 15, 100)
    console.print_status()
    console.print_status()  # unchanged: not repeated
    console.close()
    assert out.getvalue() == b"[n0 r0] one\n[n0 r0] two\n"
    assert err.getvalue() == (
        b"[n0 progress] 10/100 (10.0%) of 2 ranks, slowest r0 10, fastest r1 15,"
        b" 10 steps/s, ETA 9s\n"
    )


def test_live_console_colours_prefixes_and_draws_the_bar_below(tmp_path: Path) -> None:
    from torchx_elastic.agent.console.output.display import LiveConsole

    activity = RankActivity()
    screen = io.StringIO()
    console = LiveConsole(activity, file=screen)
    console.start_attempt(0, {0: 0, 1: 1})
    console.lines("stdout", 1, b"[n0 r1] ", [b"plain", b"\x1b[31mred\x1b[0m"])
    console.transient(0, "stderr", b"[n0 r0] ", [b" 40%|####"])
    activity.progress(0, 0, 3, 6)
    console.close()
    output = screen.getvalue()
    assert "\x1b[35m[n0 r1] \x1b[0mplain\n" in output  # rank 1's colour: magenta
    assert "\x1b[31mred\x1b[0m" in output  # the worker's own colour survives
    # the last frame: the pending \r-line of rank 0, then the bar with its details
    last_frame = output.rsplit("\x1b[2K", 1)[-1]
    assert " 40%|####" in last_frame
    assert "3/6" in last_frame and "slowest r0 3, fastest r0 3" in last_frame
    assert last_frame.index(" 40%|####") < last_frame.index("3/6")


def test_live_console_draws_nothing_before_the_workers_start() -> None:
    from torchx_elastic.agent.console.output.display import LiveConsole

    screen = io.StringIO()
    console = LiveConsole(RankActivity(), file=screen)
    console.close()  # e.g. the launch failed before any attempt
    assert screen.getvalue() == ""


@pytest.mark.parametrize(
    ("mode", "environ", "live"),
    [
        ("auto", {}, True),
        ("auto", {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0"}, False),  # srun --unbuffered
        ("auto", {"PBS_JOBID": "7.pbs"}, False),
        ("auto", {"LSB_JOBID": "7"}, False),
        ("auto", {"SLURM_JOB_ID": "7", "SLURM_PTY_PORT": "4242"}, True),  # srun --pty
        ("live", {"SLURM_JOB_ID": "7"}, True),  # asked for
        ("plain", {}, False),
    ],
)
def test_auto_console_on_a_terminal_is_plain_in_a_batch_job(
    mode: ConsoleMode, environ: dict[str, str], live: bool
) -> None:
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as terminal:
        assert wants_live(mode, terminal, environ) is live
    os.close(leader)


def test_auto_console_without_a_terminal_is_plain(tmp_path: Path) -> None:
    with open(tmp_path / "out.log", "w") as file:
        assert not wants_live("auto", file, {})


def test_plain_console_status_line_says_the_job_waits_for_nodes() -> None:
    err = io.BytesIO()
    console = PlainConsole(RankActivity(), io.BytesIO(), err, status_interval_s=0)
    line = "[job progress] waiting for nodes: 1 of 2 joined; missing: 1 node"
    console.waiting_for_nodes(line)
    console.print_status()  # unchanged: not repeated
    console.waiting_for_nodes(None)  # the round is complete: no progress yet, no line
    console.close()
    assert err.getvalue() == (line + "\n").encode()
