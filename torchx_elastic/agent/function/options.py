"""What a function launch takes beyond torch's ``LaunchConfig``: the agent's own options."""

from __future__ import annotations

from dataclasses import dataclass

from torchx_elastic.agent.console.output.display import DEFAULT_STATUS_INTERVAL_S
from torchx_elastic.contract.agent_args import CONSOLE_MODES, DEFAULT_CONSOLE


@dataclass(frozen=True)
class AgentOptions:
    """torchx-elastic's agent options (the command line's ``--console``, ... flags)."""

    console: str = DEFAULT_CONSOLE
    console_ranks: str = "all"
    status_interval_s: float = DEFAULT_STATUS_INTERVAL_S
    hang_timeout_s: float = 0.0
    exit_barrier_timeout_s: float = 30.0
    tee: int = 3

    def __post_init__(self) -> None:
        if self.console not in CONSOLE_MODES:
            raise ValueError(f"console={self.console!r} is not one of {', '.join(CONSOLE_MODES)}")
        if self.tee not in (0, 1, 2, 3):
            raise ValueError(
                f"tee={self.tee!r} is not 0 (no worker output on the console), 1 (stdout),"
                " 2 (stderr) or 3 (both)"
            )
