"""torchx's Slurm scheduler with one retry budget (the agent's) and a status after a cancel."""

from __future__ import annotations

import subprocess
from typing import Any, Optional

from torchx.schedulers.api import AppDryRunInfo, DescribeAppResponse
from torchx.schedulers.slurm_scheduler import SlurmScheduler as _TorchxSlurmScheduler
from torchx.specs import AppDef, Role, is_terminal

from torchx_elastic.components.agent_command import AGENT_MODULE
from torchx_elastic.schedulers.compat import torchx_reads_every_slurm_state
from torchx_elastic.schedulers.progress_status import join_message
from torchx_elastic.schedulers.slurm.progress import progress_of
from torchx_elastic.schedulers.slurm.status import (
    SQUEUE_FORMAT,
    SQUEUE_HEADER,
    describe_from_sacct,
)

# torchx's development line reads every sacct state itself: its describe is kept
TORCHX_READS_EVERY_STATE = torchx_reads_every_slurm_state()


def runs_the_agent(role: Role) -> bool:
    """The role is one of our components' (``python3 -m torchx_elastic.agent ...``)."""
    args = list(role.args)
    return any(a == "-m" and b == AGENT_MODULE for a, b in zip(args, args[1:], strict=False))


class SlurmScheduler(_TorchxSlurmScheduler):
    def _submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[Any]:
        info: AppDryRunInfo[Any] = super()._submit_dryrun(app, cfg)
        if any(runs_the_agent(role) for role in app.roles):
            # the agent's --max-restarts are the job's retries: no requeue after a failure
            # (the sbatch script requeues while SLURM_RESTART_COUNT < max_retries)
            info.request.max_retries = 0
        return info

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        """The Slurm state, and while the job runs the rank-0 agent's progress line (or what
        its first round waits for) on a line of its own (``progress.py``)."""
        found = self._state(app_id)
        if found is None or is_terminal(found.state) or not found.roles:
            return found
        progress = (progress_of(app_id, role.name) for role in found.roles)
        found.msg = join_message(found.msg, next((p for p in progress if p), None))
        return found

    def _state(self, app_id: str) -> Optional[DescribeAppResponse]:
        """sacct's view; squeue's for a job that sacct does not show yet (the first second
        after sbatch, where torchx's ``run --wait`` would stop with "unknown status")."""
        if TORCHX_READS_EVERY_STATE:
            found: Optional[DescribeAppResponse] = super().describe(app_id)
            return found
        sacct = subprocess.run(
            ["sacct", "--parsable2", "-j", app_id], stdout=subprocess.PIPE, check=True, text=True
        )
        found = describe_from_sacct(app_id, sacct.stdout)
        if found is None:
            squeue = subprocess.run(
                ["squeue", "--noheader", "-j", app_id, "-o", SQUEUE_FORMAT],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            if squeue.returncode == 0:
                found = describe_from_sacct(app_id, SQUEUE_HEADER + "\n" + squeue.stdout)
        return found
