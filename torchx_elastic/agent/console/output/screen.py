"""What a terminal would show of one worker stream that is a pseudo-terminal.

Where the agent's output reaches a person's terminal, a worker's stdout and stderr are
pseudo-terminals (``processes.py``), as under torchrun, where the worker inherits the
terminal: Rich's live displays, ``tqdm(position=...)`` and Lightning's Rich bar then redraw
a region of lines with cursor movement. :class:`Screen` plays the bytes as a terminal would
(text, ``\\r``, ``\\n``, backspace, tab, cursor up / down / left / right / column, erase in
line and below) and splits the result in two:

- **finished lines**, which the program can no longer reach: plain text, no escape sequence
  (colours and hyperlinks are dropped), the final state of a redrawn region. They go to the
  console under the rank's prefix and to the rank's files, as lines from a pipe do.
- **live rows**: the region the program still redraws (the lines within its reach above the
  cursor, and the cursor's own line). The console draws them under the rank's prefix, above
  the job's bar, until they are finished.

A line above the cursor is out of reach once it is further up than the program ever moved the
cursor back (a one-line ``\\r`` bar reaches no line above it; a Rich table of five rows
reaches four) or than the terminal is high. A program's region may be written in pieces
before its first move back up (``tqdm`` moves down to its position, then back up), so a line
is finished only once it has been out of reach for :data:`SETTLE_S`, or for
:data:`HIDDEN_SETTLE_S` while the program hides the cursor and has not moved up yet (Rich hides
it for the whole of a live display, and draws the first state of a region a refresh before it
first moves back over it). When the stream ends, every line left is finished.

Standard library only.
"""

from __future__ import annotations

import codecs
import re
import time

# how long a line stays out of the program's reach before it is finished
SETTLE_S = 0.3
HIDDEN_SETTLE_S = 1.0
# rows of a terminal that reports no size (as Rich and tqdm assume)
DEFAULT_ROWS = 25
TAB = 8
# what is not text: C0 controls and DEL (escape sequences begin with ESC)
_CONTROL = re.compile("[\x00-\x1f\x7f]")


class Screen:
    """One stream's lines that are not finished yet, with the cursor among them."""

    def __init__(
        self, rows: int = 0, settle_s: float = SETTLE_S, hidden_settle_s: float = HIDDEN_SETTLE_S
    ) -> None:
        self._lines: list[list[str]] = [[]]
        self._touched: list[float] = [0.0]  # when the cursor last left each line
        self._row = 0
        self._col = 0
        self._reach = 0  # the furthest the program moved the cursor up
        self._hidden = False  # the program hid the cursor (a live display draws)
        self._settle_s = settle_s
        self._hidden_settle_s = hidden_settle_s
        self._now = 0.0
        self.rows = rows
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._escape = ""  # an escape sequence cut off at the end of the last read

    @property
    def rows(self) -> int:
        return self._height

    @rows.setter
    def rows(self, rows: int) -> None:
        self._height = rows if rows > 0 else DEFAULT_ROWS

    def feed(self, data: bytes, now: float | None = None) -> list[str]:
        """Play ``data`` (at ``now``, ``time.monotonic()``'s clock); the lines it finished."""
        self._now = time.monotonic() if now is None else now
        text = self._escape + self._decoder.decode(data)
        self._escape = ""
        i, n = 0, len(text)
        while i < n:
            special = _CONTROL.search(text, i)
            stop = n if special is None else special.start()
            if stop > i:  # a run of text: written at once
                self._put(text[i:stop])
                i = stop
                continue
            ch = text[i]
            if ch == "\x1b":
                end = _sequence_end(text, i)
                if end < 0:  # cut off: kept for the next read
                    self._escape = text[i:]
                    break
                self._control(text[i:end])
                i = end
                continue
            i += 1
            if ch == "\n":
                self._move_to(self._row + 1)
                self._col = 0  # the pty adds no \r (ONLCR is off): as a pipe's lines
            elif ch == "\r":
                self._col = 0
            elif ch == "\b":
                self._col = max(0, self._col - 1)
            elif ch == "\t":
                self._col = (self._col // TAB + 1) * TAB
        return self.settled(self._now)

    def settled(self, now: float) -> list[str]:
        """The lines finished by now: out of reach for long enough, or scrolled away."""
        finished: list[str] = []
        settle_s = self._hidden_settle_s if self._hidden and not self._reach else self._settle_s
        while self._row > 0:
            distance = self._row
            scrolled = distance >= self._height
            out_of_reach = distance > self._reach and now - self._touched[0] >= settle_s
            if not (scrolled or out_of_reach):
                break
            finished.append(_plain(self._lines.pop(0)))
            self._touched.pop(0)
            self._row -= 1
        return finished

    def live(self) -> list[str]:
        """The rows the program may still redraw; trailing empty ones left out."""
        rows = [_plain(line) for line in self._lines]
        while rows and not rows[-1].strip():
            rows.pop()
        return rows

    def flush(self) -> list[str]:
        """The stream ended: every line left, as last drawn (a last empty one left out)."""
        text = self._escape + self._decoder.decode(b"", final=True)
        self._escape = ""
        if text:
            self.feed(text.encode(), now=0.0)
        lines = [_plain(line) for line in self._lines]
        if lines and not lines[-1]:
            lines.pop()
        self._lines, self._touched, self._row, self._col = [[]], [0.0], 0, 0
        return lines

    def _put(self, run: str) -> None:
        line = self._lines[self._row]
        if self._col > len(line):
            line += " " * (self._col - len(line))
        end = self._col + len(run)
        line[self._col : end] = run
        self._col = end

    def _move_to(self, row: int) -> None:
        """The cursor to ``row`` (below the last line: new lines, as a terminal scrolls)."""
        self._touched[self._row] = self._now
        row = max(0, row)
        if row < self._row:  # how far above the lowest line drawn yet (moves come one by one)
            bottom = len(self._lines) - 1
            self._reach = max(self._reach, min(bottom - row, self._height - 1))
        while row >= len(self._lines):
            self._lines.append([])
            self._touched.append(0.0)
        self._row = row

    def _control(self, seq: str) -> None:
        if len(seq) < 2 or seq[1] != "[":
            return  # OSC (hyperlinks, titles), charset and other two-byte sequences: dropped
        final, body = seq[-1], seq[2:-1]
        private = body.startswith("?")
        if private:
            if body[1:] == "25":
                self._hidden = final == "l"
            return
        count = _first_number(body)
        if final == "A":
            self._move_to(self._row - max(count, 1))
        elif final in "BE":
            self._move_to(self._row + max(count, 1))
            if final == "E":
                self._col = 0
        elif final == "F":
            self._move_to(self._row - max(count, 1))
            self._col = 0
        elif final == "C":
            self._col += max(count, 1)
        elif final == "D":
            self._col = max(0, self._col - max(count, 1))
        elif final == "G":
            self._col = max(count, 1) - 1
        elif final == "K":
            line = self._lines[self._row]
            if count == 0:
                del line[self._col :]
            elif count == 1:
                line[: self._col + 1] = [" "] * min(self._col + 1, len(line))
            else:
                line.clear()
        elif final == "J" and count == 0:
            del self._lines[self._row][self._col :]
            for below in range(self._row + 1, len(self._lines)):
                self._lines[below] = []


def _sequence_end(text: str, start: int) -> int:
    """Where the escape sequence at ``start`` ends; -1 when ``text`` ends inside it."""
    if start + 1 >= len(text):
        return -1
    kind = text[start + 1]
    if kind == "[":  # CSI: parameters and intermediates, then one final byte @..~
        for i in range(start + 2, len(text)):
            if "@" <= text[i] <= "~":
                return i + 1
        return -1
    if kind == "]":  # OSC: ends with BEL or ST (ESC \)
        for i in range(start + 2, len(text)):
            if text[i] == "\x07":
                return i + 1
            if text[i] == "\x1b" and text[i + 1 : i + 2] == "\\":
                return i + 2
        return -1
    if kind in "()*+":  # designate a character set: one more byte
        return start + 3 if start + 2 < len(text) else -1
    return start + 2


def _first_number(body: str) -> int:
    head = body.split(";", 1)[0]
    return int(head) if head.isdigit() else 0


def _plain(line: list[str]) -> str:
    return "".join(line).rstrip()
