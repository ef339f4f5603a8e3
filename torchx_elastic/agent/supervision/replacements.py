"""Which node took the place of which when a round re-formed, said once for the job.

Members are named ``addr (agent pid N)`` (``membership.round_members``). Between two rounds
of the same job, the nodes that left and those that came are paired: a node back at the
address of a lost one first (its agent came back: a returning member gets its place before
a spare, rendezvous/rounds/outcome.py), then the others in order (a spare, or a node new to
the job). The first node of the new round that was also in the previous one says it, as
one line and one ``replaced`` event; a round that only grew or only shrank replaces nobody.
"""

from __future__ import annotations

from dataclasses import dataclass

PID_MARK = " (agent pid "


@dataclass(frozen=True)
class Replacement:
    lost: str
    by: str

    @property
    def back(self) -> bool:
        """The new node published the lost one's address (its agent came back)."""
        return self.by.partition(PID_MARK)[0] == self.lost.partition(PID_MARK)[0]

    def text(self) -> str:
        if self.back:
            return f"{self.by}, back, takes the place of {self.lost}, lost, before any spare"
        return f"{self.by} takes the place of {self.lost}, lost"

    def facts(self) -> dict[str, object]:
        return {"lost": self.lost, "by": self.by, "back": self.back}


def replacements(before: dict[int, str], after: dict[int, str]) -> list[Replacement]:
    """The lost members of ``before`` (node rank -> name) paired with the newcomers of
    ``after``; empty when either side has none."""
    gone = [name for name in before.values() if name not in after.values()]
    came = [name for name in after.values() if name not in before.values()]
    pairs: list[Replacement] = []
    for lost in list(gone):
        address = lost.partition(PID_MARK)[0]
        by = next((c for c in came if c.partition(PID_MARK)[0] == address), None)
        if by is not None:
            pairs.append(Replacement(lost, by))
            gone.remove(lost)
            came.remove(by)
    pairs += [Replacement(lost, by) for lost, by in zip(gone, came, strict=False)]
    return pairs


def teller(before: dict[int, str], after: dict[int, str]) -> int | None:
    """The node rank of the new round that says the replacements: the first that was also
    in the previous round (None: nobody was)."""
    kept = [rank for rank, name in after.items() if name in before.values()]
    return min(kept) if kept else None


def replaced_line(round_: int, pairs: list[Replacement], world: int) -> str:
    """``torchx-elastic: round 2: h2 (agent pid 7) takes the place of h1 (agent pid 5),
    lost; the job is back at 2 nodes``"""
    return (
        f"torchx-elastic: round {round_}: {'; '.join(p.text() for p in pairs)}; the job is"
        f" back at {world} node{'s' if world != 1 else ''}"
    )
