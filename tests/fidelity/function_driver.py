"""A function launch of the probe: ``python function_driver.py torch|ours START_METHOD``
prints ``PROBE-RESULTS`` and the JSON list of each rank's observations."""

import json
import sys
import uuid

from torch.distributed.launcher.api import LaunchConfig
from torch.distributed.launcher.api import elastic_launch as torch_launch

from tests.fidelity import probe
from torchx_elastic.launcher import elastic_launch

if __name__ == "__main__":
    which, start_method = sys.argv[1:3]
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=2,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        run_id=str(uuid.uuid4()),
        start_method=start_method,
        monitor_interval=0.1,
    )
    launcher = torch_launch if which == "torch" else elastic_launch
    results = launcher(config, probe.observe)()
    print("PROBE-RESULTS " + json.dumps([results[r] for r in sorted(results)], default=str))
