"""A function launch of the probe: ``python function_driver.py torch|ours START_METHOD``
prints ``PROBE-RESULTS`` and the JSON list of each rank's observations."""

import json
import sys
import uuid

from torch.distributed.launcher import api as torch_api

from tests.fidelity import probe
from torchx_elastic import launcher as ours

if __name__ == "__main__":
    which, start_method = sys.argv[1:3]
    # each launcher with its own LaunchConfig (torch's asks CUDA in the caller: torch 2.14+)
    api = torch_api if which == "torch" else ours
    config = api.LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        start_method=start_method,
        monitor_interval=0.1,
    )
    results = api.elastic_launch(config, probe.observe)()
    print("PROBE-RESULTS " + json.dumps([results[r] for r in sorted(results)], default=str))
