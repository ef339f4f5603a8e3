"""The AppDef behind ``ft.ddp``: one Lighthouse role and R replica-group roles.

- ``lighthouse`` (first role, one replica): torchft's Lighthouse
  (``python -m torchx_elastic.ft.lighthouse``), which exits once every group has ended;
- ``group0`` .. ``group<R-1>``: each the same multi-node job as ``dist.ddp -j NxM`` (the
  bundled agent, its own rendezvous on ``rdzv_port + g``, its own in-place restarts), started
  through ``python -m torchx_elastic.ft.group``, which sets ``TORCHFT_LIGHTHOUSE`` and reports
  the group's end to the Lighthouse role. ``REPLICA_GROUP_ID`` and ``NUM_REPLICA_GROUPS`` are
  set as torchft's own component sets them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torchx.specs as specs

from torchx_elastic.components.dist_app import DistApp
from torchx_elastic.components.errors import ComponentArgumentError
from torchx_elastic.components.node_resource import node_resource
from torchx_elastic.contract import ROLE_RANK0_ENV
from torchx_elastic.ft.protocol import (
    GROUP_ID_ENV,
    LIGHTHOUSE_ROLE,
    NUM_GROUPS_ENV,
    group_role_name,
    registry_port,
)

LIGHTHOUSE_MODULE = "torchx_elastic.ft.lighthouse"
GROUP_MODULE = "torchx_elastic.ft.group"
# torchft's Rust side logs every quorum check at INFO; --env RUST_LOG=info shows them again
RUST_LOG_ENV = "RUST_LOG"
DEFAULT_RUST_LOG = "warn"


class FtUsageError(ComponentArgumentError):
    """A combination of ``ft.ddp`` parameters that cannot make a job."""


@dataclass(frozen=True)
class FtApp:
    """``ft.ddp``'s parameters: one group's job (``group``, as ``dist.ddp`` builds it) and
    how many groups, plus torchft's Lighthouse settings."""

    group: DistApp
    replica_groups: int
    min_replica_groups: int = 1
    lighthouse_port: int = 29510
    join_timeout_ms: int = 10000
    heartbeat_timeout_ms: int = 5000
    quorum_tick_ms: int = 100
    lighthouse_cpu: float = 0.5
    lighthouse_memMB: int = 512

    def __post_init__(self) -> None:
        if self.replica_groups < 1:
            raise FtUsageError(
                f"--replica_groups {self.replica_groups}: expected 1 or more replica groups"
            )
        if not 1 <= self.min_replica_groups <= self.replica_groups:
            raise FtUsageError(
                f"--min_replica_groups {self.min_replica_groups}: expected 1 to"
                f" --replica_groups ({self.replica_groups}), the groups a step needs"
            )
        if self.group.size.is_elastic:
            raise FtUsageError(
                f"-j {self.group.size}: a replica group of ft.ddp has a fixed size, give -j NxM"
                " (nodes x processes of each group); --replica_groups and"
                " --min_replica_groups set how many groups train"
            )
        if self.group.rdzv_backend != "c10d":
            raise FtUsageError(
                f"--rdzv_backend {self.group.rdzv_backend}: ft.ddp's groups rendezvous with"
                " c10d (each group restarts on its own)"
            )
        group_ports = range(self.group.rdzv_port, self.group.rdzv_port + self.replica_groups)
        taken = {self.lighthouse_port, registry_port(self.lighthouse_port)} & set(group_ports)
        if taken:
            raise FtUsageError(
                f"--lighthouse_port {self.lighthouse_port} (and {self.lighthouse_port + 1} for"
                f" the groups' registry) overlaps the groups' rendezvous ports"
                f" {group_ports.start}..{group_ports.stop - 1} (--rdzv_port + group):"
                " move one of them"
            )

    def build(self) -> specs.AppDef:
        groups = [self._group_role(g) for g in range(self.replica_groups)]
        app = self.group.build()
        return specs.AppDef(
            name=app.name, roles=[self._lighthouse_role(groups[0]), *groups], metadata=app.metadata
        )

    def _group_role(self, group: int) -> specs.Role:
        env = {
            RUST_LOG_ENV: DEFAULT_RUST_LOG,
            **self.group.env,
            GROUP_ID_ENV: str(group),
            NUM_GROUPS_ENV: str(self.replica_groups),
        }
        one_group = replace(
            self.group,
            env=env,
            rdzv_port=self.group.rdzv_port + group,
            rank0_variable=ROLE_RANK0_ENV,
            # torchft's Manager hands its group's store (MASTER_ADDR) and gloo listeners to
            # the other groups: on a one-node group too, they must not be on loopback only
            reached_from_outside=True,
        )
        role: specs.Role = one_group.build().roles[0]
        role.name = group_role_name(group)
        role.args = [
            "-m",
            GROUP_MODULE,
            "--node",
            specs.macros.replica_id,
            "--lighthouse_port",
            str(self.lighthouse_port),
            "--",
            *role.args,
        ]
        return role

    def _lighthouse_role(self, group: specs.Role) -> specs.Role:
        return specs.Role(
            name=LIGHTHOUSE_ROLE,
            image=group.image,
            entrypoint=group.entrypoint,
            args=[
                "-m",
                LIGHTHOUSE_MODULE,
                "--num_groups",
                str(self.replica_groups),
                "--port",
                str(self.lighthouse_port),
                "--min_replicas",
                str(self.min_replica_groups),
                "--join_timeout_ms",
                str(self.join_timeout_ms),
                "--quorum_tick_ms",
                str(self.quorum_tick_ms),
                "--heartbeat_timeout_ms",
                str(self.heartbeat_timeout_ms),
            ],
            num_replicas=1,
            resource=node_resource(
                cpu=self.lighthouse_cpu, gpu=0, memMB=self.lighthouse_memMB, h=None
            ),
            env={k: v for k, v in group.env.items() if k not in (GROUP_ID_ENV, NUM_GROUPS_ENV)},
            port_map={
                "lighthouse": self.lighthouse_port,
                "registry": registry_port(self.lighthouse_port),
            },
            mounts=list(group.mounts),
        )
