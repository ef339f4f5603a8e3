"""Per-attempt, per-rank log files: ``<log_dir>/attempt_<k>/rank_<r>/{stdout,stderr}.log``."""

from __future__ import annotations

import os

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from torchx_elastic.contract import ERROR_FILE_ENV, RESTART_COUNT_ENV
from torchx_elastic.contract.log_layout import NodeLogs


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
        logs = NodeLogs(self._log_dir)
        for local_rank, env in envs.items():
            attempt, rank = env.get(RESTART_COUNT_ENV, "0"), env["RANK"]
            os.makedirs(logs.rank_dir(attempt, rank), exist_ok=True)
            dest.stdouts[local_rank] = logs.rank_stdout(attempt, rank)
            dest.stderrs[local_rank] = logs.rank_stderr(attempt, rank)
            error_file = logs.rank_error_file(attempt, rank)
            if os.path.exists(error_file):
                os.remove(error_file)  # left from an earlier run with the same directory
            dest.error_files[local_rank] = error_file
            env[ERROR_FILE_ENV] = error_file
        return dest
