"""``python -m torchx_elastic.pipelines``: submit to Kubernetes and wait (see ``command.py``)."""

from __future__ import annotations

import logging
import sys
from typing import List, Optional

from torchx.runner import get_runner

from torchx_elastic.pipelines.command import parse_app, parse_outputs, parser
from torchx_elastic.pipelines.step import SCHEDULER, Step, write_outputs

logger = logging.getLogger(__name__)


def main(argv: Optional[List[str]] = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    app = parse_app(args, p)
    outputs = parse_outputs(args, p)
    runner = get_runner()
    cfg = runner.scheduler_run_opts(SCHEDULER).cfg_from_str(args.cfg)
    step = Step(sys.stdout, runner)
    step.handle_signals()
    status = step.run(app, cfg)
    if status == 0:
        write_outputs(outputs)
    return status


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())
