"""Per-attempt, per-rank log files: ``<log_dir>/attempt_<k>/rank_<r>/{stdout,stderr}.log``."""

from __future__ import annotations

import os

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from torchx_elastic.agent.error_file import ERROR_FILE_ENV


class RankLogsSpecs(LogsSpecs):
    """Log files keyed by global rank, so several nodes can share one log directory."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir=log_dir)
        self._log_dir = log_dir

    @property
    def root_log_dir(self) -> str:
        return self._log_dir

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = LogsDest()
        for local_rank, env in envs.items():
            rank_dir = os.path.join(
                self._log_dir,
                f"attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
                f"rank_{env['RANK']}",
            )
            os.makedirs(rank_dir, exist_ok=True)
            dest.stdouts[local_rank] = os.path.join(rank_dir, "stdout.log")
            dest.stderrs[local_rank] = os.path.join(rank_dir, "stderr.log")
            error_file = os.path.join(rank_dir, "error.json")
            if os.path.exists(error_file):
                os.remove(error_file)  # left from an earlier run with the same directory
            dest.error_files[local_rank] = error_file
            env[ERROR_FILE_ENV] = error_file
        return dest
