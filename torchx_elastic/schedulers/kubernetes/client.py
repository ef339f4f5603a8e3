"""The Kubernetes API as this scheduler uses it, with errors that say what to do.

``kubernetes`` is imported inside functions: loading this module costs nothing. Objects
travel as the API's own JSON (dicts), read with ``_preload_content=False``, so status
code reads the same fields on a real cluster, on the fake one and in the docs.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional

from torchx_elastic.schedulers.errors import UserError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

Obj = Dict[str, Any]

VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_VERSION = "v1alpha1"
VOLCANO_PLURAL = "jobs"
# a dead API server should fail the command in seconds, not after urllib3's 3 retries
CONNECT_RETRIES = 1


class KubernetesError(UserError, RuntimeError):
    """A Kubernetes API call that failed, worded for the person at the terminal."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _kubeconfig() -> Optional[str]:
    return os.environ.get("KUBECONFIG") or None


def load_api_client() -> ApiClient:
    """An API client for the current kubeconfig context, or the in-cluster account."""
    from kubernetes import client, config

    configuration = client.Configuration()
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            config.load_incluster_config(client_configuration=configuration)
        else:
            # kubernetes reads $KUBECONFIG once, at import: read it now
            config.load_kube_config(_kubeconfig(), client_configuration=configuration)
    except config.ConfigException as e:
        where = "in-cluster" if in_cluster else _kubeconfig() or "~/.kube/config"
        raise KubernetesError(
            f"no usable Kubernetes configuration ({where}): {str(e).rstrip('. ')}."
            " Point KUBECONFIG at a kubeconfig file (e.g. one written by your cloud's"
            " get-credentials command) or run inside the cluster with a service account"
        ) from e
    configuration.retries = CONNECT_RETRIES
    return client.ApiClient(configuration)


def current_namespace() -> str:
    """The namespace of the current kubeconfig context (``default`` if it names none)."""
    from kubernetes import config

    try:
        _, active = config.list_kube_config_contexts(_kubeconfig())
    except config.ConfigException:
        return "default"
    return str(active.get("context", {}).get("namespace") or "default")


def _status_message(body: Any) -> str:
    try:
        return str(json.loads(body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(body or "").strip()


@contextmanager
def api_errors(action: str, host: str) -> Iterator[None]:
    """Turns client and connection errors while doing ``action`` into KubernetesError."""
    from kubernetes.client.rest import ApiException
    from urllib3.exceptions import HTTPError  # type: ignore[import-untyped,unused-ignore]

    try:
        yield
    except ApiException as e:
        status = int(e.status or 0)
        message = _status_message(e.body) or str(e.reason)
        if status == 401:
            hint = (
                f"cannot {action}: the API server at {host} did not accept your credentials"
                f" ({message}); refresh them (e.g. your cloud's get-credentials command)"
            )
        elif status == 403:
            hint = (
                f"cannot {action}: forbidden ({message}). Ask a cluster admin for a Role"
                " that grants it, or choose a namespace you may use with -cfg namespace=NAME"
            )
        elif status == 404 and re.fullmatch(r'namespaces "[^"]+" not found', message):
            namespace = message.split('"')[1]
            hint = (
                f"cannot {action}: the namespace {namespace} does not exist; create it"
                f" (kubectl create namespace {namespace}) or choose another with"
                " -cfg namespace=NAME"
            )
        else:
            hint = f"cannot {action}: HTTP {status} {e.reason}: {message}"
        raise KubernetesError(hint, status) from e
    except HTTPError as e:
        # urllib3 prefixes the reason with the repr of its connection object
        reason = re.sub(r"^<[^>]*>: ", "", str(getattr(e, "reason", None) or e))
        raise KubernetesError(
            f"cannot {action}: the Kubernetes API server at {host} is unreachable ({reason})."
            " Check that the cluster is up and that `kubectl config current-context` names it"
        ) from e


def _leading_number(text: Any) -> int:
    match = re.match(r"\d+", str(text or ""))
    return int(match.group()) if match else 0


class KubeApi:
    """The calls the scheduler makes, each returning the API's JSON."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api_client = api_client

    @property
    def host(self) -> str:
        return str(self._api_client.configuration.host)

    def _batch(self) -> Any:
        from kubernetes import client

        return client.BatchV1Api(self._api_client)

    def _core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self._api_client)

    def _custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self._api_client)

    def _call(self, action: str, method: Any, *args: Any, **kwargs: Any) -> Obj:
        with api_errors(action, self.host):
            response = method(*args, _preload_content=False, **kwargs)
            result: Obj = json.loads(response.data)
            return result

    def create(self, manifest: Obj) -> Obj:
        kind = manifest["kind"]
        namespace = manifest["metadata"]["namespace"]
        action = f"create {kind} {manifest['metadata']['name']} in namespace {namespace}"
        if manifest["apiVersion"] == "batch/v1":
            return self._call(action, self._batch().create_namespaced_job, namespace, manifest)
        if manifest["apiVersion"] == "v1" and kind == "Service":
            return self._call(action, self._core().create_namespaced_service, namespace, manifest)
        if manifest["apiVersion"] == "v1" and kind == "Secret":
            return self._call(action, self._core().create_namespaced_secret, namespace, manifest)
        if kind == "NetworkPolicy":
            from kubernetes import client

            networking = client.NetworkingV1Api(self._api_client)
            return self._call(
                action, networking.create_namespaced_network_policy, namespace, manifest
            )
        return self._call(
            action,
            self._custom().create_namespaced_custom_object,
            VOLCANO_GROUP,
            VOLCANO_VERSION,
            namespace,
            VOLCANO_PLURAL,
            manifest,
        )

    def server_version(self) -> tuple[int, int]:
        """(major, minor) of the API server; a provider's ``29+`` reads as 29."""
        from kubernetes import client

        found = self._call("read the server version", client.VersionApi(self._api_client).get_code)
        return _leading_number(found.get("major")), _leading_number(found.get("minor"))

    def read_job(self, namespace: str, name: str) -> Obj:
        action = f"read Job {name} in namespace {namespace}"
        return self._call(action, self._batch().read_namespaced_job, name, namespace)

    def read_volcano_job(self, namespace: str, name: str) -> Obj:
        action = f"read Volcano Job {name} in namespace {namespace}"
        return self._call(
            action,
            self._custom().get_namespaced_custom_object,
            VOLCANO_GROUP,
            VOLCANO_VERSION,
            namespace,
            VOLCANO_PLURAL,
            name,
        )

    def list_jobs(self, namespace: str, selector: str) -> List[Obj]:
        action = f"list Jobs in namespace {namespace}"
        found = self._call(
            action, self._batch().list_namespaced_job, namespace, label_selector=selector
        )
        return list(found.get("items") or [])

    def list_pods(self, namespace: str, selector: str) -> List[Obj]:
        action = f"list pods in namespace {namespace}"
        found = self._call(
            action, self._core().list_namespaced_pod, namespace, label_selector=selector
        )
        return list(found.get("items") or [])

    def list_events(self, namespace: str, field_selector: str) -> List[Obj]:
        action = f"list events in namespace {namespace}"
        found = self._call(
            action, self._core().list_namespaced_event, namespace, field_selector=field_selector
        )
        return list(found.get("items") or [])

    def delete_job(self, namespace: str, name: str) -> None:
        # batch/v1 Jobs orphan their pods unless told otherwise
        self._call(
            f"delete Job {name} in namespace {namespace}",
            self._batch().delete_namespaced_job,
            name,
            namespace,
            propagation_policy="Background",
        )

    def delete_service(self, namespace: str, name: str) -> None:
        self._call(
            f"delete Service {name} in namespace {namespace}",
            self._core().delete_namespaced_service,
            name,
            namespace,
        )

    def delete_volcano_job(self, namespace: str, name: str) -> None:
        self._call(
            f"delete Volcano Job {name} in namespace {namespace}",
            self._custom().delete_namespaced_custom_object,
            VOLCANO_GROUP,
            VOLCANO_VERSION,
            namespace,
            VOLCANO_PLURAL,
            name,
            propagation_policy="Background",
        )

    def pod_log_tail(self, namespace: str, pod: str, tail_lines: int) -> str:
        """The last ``tail_lines`` lines of a pod's log, each after its timestamp."""
        with api_errors(f"read the log of pod {pod} in namespace {namespace}", self.host):
            response = self._core().read_namespaced_pod_log(
                pod, namespace, tail_lines=tail_lines, timestamps=True, _preload_content=False
            )
        data = response.data
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)

    def pod_log(
        self,
        namespace: str,
        pod: str,
        follow: bool,
        since_seconds: Optional[int],
    ) -> Any:
        """The raw streaming response (``.stream()`` yields bytes as they come)."""
        kwargs: Obj = {"follow": follow}
        if since_seconds is not None:
            kwargs["since_seconds"] = since_seconds
        with api_errors(f"read the log of pod {pod} in namespace {namespace}", self.host):
            return self._core().read_namespaced_pod_log(
                pod, namespace, _preload_content=False, **kwargs
            )
