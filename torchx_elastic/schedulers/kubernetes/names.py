"""Names of a job's Kubernetes objects: DNS labels, deterministic, unique per run."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from torchx_elastic.schedulers.errors import UserError
from torchx_elastic.schedulers.names import DNS_LABEL_MAX, dns_label

SUFFIX_LENGTH = 8
# torchx 0.7's id alphabet (``torchx.schedulers.ids``; gone from its development line):
# no vowels, so no words, and a letter first, so a valid DNS label
_FIRST = "bcdfghjklmnpqrstvwxz"
_REST = _FIRST + "012345679"


def new_suffix() -> str:
    """A random suffix that starts with a letter (torchx's id alphabet)."""
    rest = "".join(secrets.choice(_REST) for _ in range(SUFFIX_LENGTH - 1))
    return secrets.choice(_FIRST) + rest


@dataclass(frozen=True)
class JobNames:
    """The names of one run: ``<app name>-<suffix>``, short enough for every derived name.

    ``longest_child`` is the longest name part the backend appends to the job name for a
    pod hostname (``-<index>`` for an Indexed Job, ``-<task>-0`` for Volcano).
    """

    job: str
    namespace: str

    @classmethod
    def create(cls, app_name: str, namespace: str, suffix: str, longest_child: int) -> JobNames:
        budget = DNS_LABEL_MAX - longest_child - len(suffix) - 1
        return cls(job=f"{dns_label(app_name, budget)}-{suffix}", namespace=namespace)

    @property
    def service(self) -> str:
        """The headless Service: the same name as the job (names are unique per kind)."""
        return self.job

    @property
    def app_id(self) -> str:
        return f"{self.namespace}:{self.job}"

    def pod_host(self, hostname: str) -> str:
        """The DNS name of a pod with this hostname whose subdomain is the Service.

        Without the cluster domain (``cluster.local`` by default) so that it works on
        every cluster: the pods' DNS search path completes it.
        """
        return f"{hostname}.{self.service}.{self.namespace}.svc"


class AppIdError(UserError, ValueError):
    """An app id that is not ``NAMESPACE:JOB``."""


def parse_app_id(app_id: str) -> tuple[str, str]:
    """``namespace:job`` as (namespace, job)."""
    namespace, sep, job = app_id.partition(":")
    if not sep or not namespace or not job:
        raise AppIdError(
            f"invalid kubernetes app id {app_id!r}: expected NAMESPACE:JOB"
            " (e.g. default:train-bcdfghjk), as printed by torchx run"
        )
    return namespace, job
