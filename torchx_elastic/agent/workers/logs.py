"""Per-attempt, per-rank log files: ``<log_dir>/attempt_<k>/rank_<r>/{stdout,stderr}.log``."""

from __future__ import annotations

import os

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from torchx_elastic.contract import ERROR_FILE_ENV, RESTART_COUNT_ENV

STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
ERROR_FILE = "error.json"


def rank_dir(log_dir: str, attempt: int | str, rank: int | str) -> str:
    """``<log_dir>/attempt_<attempt>/rank_<rank>``: the files of global rank ``rank``."""
    return os.path.join(log_dir, f"attempt_{attempt}", f"rank_{rank}")


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
            files = rank_dir(self._log_dir, env.get(RESTART_COUNT_ENV, "0"), env["RANK"])
            os.makedirs(files, exist_ok=True)
            dest.stdouts[local_rank] = os.path.join(files, STDOUT_FILE)
            dest.stderrs[local_rank] = os.path.join(files, STDERR_FILE)
            error_file = os.path.join(files, ERROR_FILE)
            if os.path.exists(error_file):
                os.remove(error_file)  # left from an earlier run with the same directory
            dest.error_files[local_rank] = error_file
            env[ERROR_FILE_ENV] = error_file
        return dest
