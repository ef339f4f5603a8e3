"""A replacement container is a node of its own in the rendezvous: the same host name and
the same agent pid (1, as in a container) as the node it replaces, yet another node
(rendezvous/rounds/keys.py's ``Node``: a random number per handler)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.ci import unavailable

# what each "container" prints: the node this process joins the rendezvous as
NODE_OF_A_FRESH_PROCESS = """
import json, os
from torch.distributed import HashStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torchx_elastic.agent.config.endpoint import Endpoint
from torchx_elastic.agent.config.rdzv_settings import RendezvousSettings
from torchx_elastic.agent.rendezvous.handler import handler_on_store
from torchx_elastic.agent.rendezvous.signed_store import StoreSigner

params = RendezvousParameters("c10d", "pod-1:29400", "job", 2, 2, local_addr="pod-1")
settings = RendezvousSettings.parse(params.config)
endpoint = Endpoint("pod-1", 29400)
handler = handler_on_store(HashStore(), params, settings, StoreSigner(None), endpoint)
node = handler.torch_handler().node
print(json.dumps([node.addr, node.pid, node.local_id, os.getpid()]))
"""


def _node_in_a_container() -> list[object]:
    """The node descriptor of a fresh agent process that is pid 1 of its own pid namespace."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
         NODE_OF_A_FRESH_PROCESS],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.splitlines()[-1]))


def test_a_replacement_container_is_not_taken_for_the_node_it_replaces() -> None:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        unavailable("no unshare as root, for a process that is pid 1 of its own namespace")
    lost, replacement = _node_in_a_container(), _node_in_a_container()
    assert lost[:2] == replacement[:2] == ["pod-1", 1] and lost[3] == replacement[3] == 1
    assert lost != replacement  # (addr, pid, local_id) tells them apart
