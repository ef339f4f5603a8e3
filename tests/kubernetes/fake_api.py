"""A stateful fake Kubernetes API server on 127.0.0.1 for the official client.

It speaks the REST paths, JSON bodies, Status errors and chunked log streams of a real
API server for what the scheduler uses (Jobs, Services, pods, pod logs, Volcano Jobs),
and runs a small Job controller: an Indexed Job gets one pod per index with the
hostname ``<job>-<index>``, a ``successPolicy`` of ``succeededIndexes`` ends the Job as
succeeded once those indexes have (removing the pods still pending or running), failed
pods are replaced up to ``backoffLimit`` (or
``backoffLimitPerIndex`` times per index, with the ``job-index-failure-count`` annotation;
a pod with a ``DisruptionTarget`` condition is not counted when the Job's
``podFailurePolicy`` ignores it), the pods still running are deleted when the Job fails,
and the Job's status and conditions follow its pods. ``/version`` answers
``server_version``. Created Jobs and Services are validated strictly
(``kubernetes-validate``), so an invalid manifest is answered 422 as a cluster would.

Tests drive the pods with the helper methods (``set_phase``, ``wait_image``, ...), and
point the client at the server with the kubeconfig that ``write_kubeconfig`` writes.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlparse

import kubernetes_validate
import yaml

Obj = Dict[str, Any]
VALIDATION_VERSION = kubernetes_validate.utils.latest_version()

_ROUTES: List[Tuple[str, re.Pattern[str]]] = [
    (kind, re.compile(pattern))
    for kind, pattern in [
        ("jobs", r"/apis/batch/v1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?"),
        ("services", r"/api/v1/namespaces/(?P<ns>[^/]+)/services(?:/(?P<name>[^/]+))?"),
        ("pods", r"/api/v1/namespaces/(?P<ns>[^/]+)/pods(?:/(?P<name>[^/]+))?(?P<log>/log)?"),
        (
            "vcjobs",
            r"/apis/batch\.volcano\.sh/v1alpha1/namespaces/(?P<ns>[^/]+)/jobs(?:/(?P<name>[^/]+))?",
        ),
        ("secrets", r"/api/v1/namespaces/(?P<ns>[^/]+)/secrets(?:/(?P<name>[^/]+))?"),
        ("events", r"/api/v1/namespaces/(?P<ns>[^/]+)/events(?:/(?P<name>[^/]+))?"),
        (
            "networkpolicies",
            r"/apis/networking\.k8s\.io/v1/namespaces/(?P<ns>[^/]+)/networkpolicies"
            r"(?:/(?P<name>[^/]+))?",
        ),
    ]
]
_GROUP = {
    "jobs": "batch",
    "services": "",
    "secrets": "",
    "networkpolicies": "networking.k8s.io",
    "pods": "",
    "events": "",
    "vcjobs": "batch.volcano.sh",
}
_RESOURCE = {kind: kind for kind in _GROUP} | {"vcjobs": "jobs"}
_VERB = {"GET": "get", "POST": "create", "DELETE": "delete"}


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Optional[Obj] = None):
        super().__init__(message)
        self.code, self.reason, self.details = code, reason, details or {}

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": str(self),
            "reason": self.reason,
            "details": self.details,
            "code": self.code,
        }


def _fields_match(obj: Obj, selector: str) -> bool:
    """A field selector of ``path.to.field=value`` terms (events: ``involvedObject.name``)."""
    for term in filter(None, selector.split(",")):
        path, _, value = term.partition("=")
        found: Any = obj
        for key in path.split("."):
            found = found.get(key) if isinstance(found, dict) else None
        if str(found) != value:
            return False
    return True


def _matches(obj: Obj, selector: Optional[str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeCluster:
    """The state of the fake cluster, and the HTTP server that serves it."""

    def __init__(
        self, user: str = "alice", volcano: bool = True, server_version: Tuple[int, int] = (1, 36)
    ) -> None:
        self.user = user
        self.volcano = volcano
        self.server_version = server_version
        self.objects: Dict[str, Dict[Tuple[str, str], Obj]] = {k: {} for k in _RESOURCE}
        self.logs: Dict[str, List[Tuple[datetime, bytes]]] = {}
        self.forbidden: set[Tuple[str, str]] = set()
        self.token_expired = False
        self.requests: List[Tuple[str, str]] = []
        self._cond = threading.Condition()
        self._uid = 0
        self._tries: Dict[Tuple[str, int], int] = {}
        self._counted: Dict[str, List[str]] = {}
        self._server: Optional[ThreadingHTTPServer] = None
        # the namespaces that exist (None: every one); creating in another answers 404
        self.namespaces: Optional[set[str]] = None
        # admission's answer to every pod a Job creates (None: admitted), e.g. 'pods "x" is
        # forbidden: exceeded quota: ...': the Job gets no pod, a FailedCreate event instead
        self.refuse_pods: Optional[str] = None

    # -- server ---------------------------------------------------------------------------

    def start(self) -> str:
        cluster = self

        class Handler(_Handler):
            fake = cluster

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        with self._cond:
            self._cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def write_kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": self.user, "user": {"token": "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": self.user, "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def forbid(self, verb: str, resource: str) -> None:
        """Answer 403 to ``verb`` (get, list, create, delete) on ``resource`` (jobs, pods...)."""
        self.forbidden.add((verb, resource))

    # -- API ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: Obj, body: Optional[Obj]) -> Any:
        if method == "GET" and path.rstrip("/") == "/version":
            major, minor = self.server_version
            return {"major": str(major), "minor": str(minor), "gitVersion": f"v{major}.{minor}.0"}
        found = [(kind, m) for kind, p in _ROUTES if (m := p.fullmatch(path))]
        if not found:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind, match = found[0]
        if kind == "vcjobs" and not self.volcano:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if self.token_expired:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        ns, name = match["ns"], match["name"]
        verb = _VERB[method] if name or method != "GET" else "list"
        self.requests.append((verb, f"{kind}/{name or ''}"))
        if (verb, _RESOURCE[kind]) in self.forbidden:
            group = _GROUP[kind]
            qualified = f"{_RESOURCE[kind]}.{group}" if group else _RESOURCE[kind]
            raise ApiError(
                403,
                "Forbidden",
                f'{qualified} is forbidden: User "{self.user}" cannot {verb} resource'
                f' "{_RESOURCE[kind]}" in API group "{group}" in the namespace "{ns}"',
                {"kind": _RESOURCE[kind], "group": group},
            )
        with self._cond:
            if verb == "create":
                return self._create(kind, ns, body or {})
            if verb == "list":
                selector = (query.get("labelSelector") or [None])[0]
                fields = (query.get("fieldSelector") or [""])[0]
                items = [
                    o
                    for (n, _), o in self.objects[kind].items()
                    if n == ns and _matches(o, selector) and _fields_match(o, fields)
                ]
                return {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}
            obj = self._get(kind, ns, name)
            if verb == "delete":
                policy = (query.get("propagationPolicy") or [None])[0]
                policy = policy or (body or {}).get("propagationPolicy")
                self._delete(kind, ns, name, policy)
                return {"kind": "Status", "apiVersion": "v1", "status": "Success"}
            return obj

    def _not_found(self, kind: str, name: str) -> ApiError:
        group = _GROUP[kind]
        qualified = f"{_RESOURCE[kind]}.{group}" if group else _RESOURCE[kind]
        return ApiError(
            404,
            "NotFound",
            f'{qualified} "{name}" not found',
            {"name": name, "group": group, "kind": _RESOURCE[kind]},
        )

    def _get(self, kind: str, ns: str, name: str) -> Obj:
        obj = self.objects[kind].get((ns, name))
        if obj is None:
            raise self._not_found(kind, name)
        return obj

    def _create(self, kind: str, ns: str, body: Obj) -> Obj:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name", "")
        if self.namespaces is not None and ns not in self.namespaces:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
        if (ns, name) in self.objects[kind]:
            group = _GROUP[kind]
            raise ApiError(
                409,
                "AlreadyExists",
                f'{_RESOURCE[kind]}.{group} "{name}" already exists',
                {"name": name, "group": group, "kind": _RESOURCE[kind]},
            )
        if kind in ("jobs", "services", "secrets", "networkpolicies"):
            try:
                kubernetes_validate.validate(obj, VALIDATION_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                message = f"{obj.get('kind')} {name!r} is invalid: {e}"
                raise ApiError(422, "Invalid", message) from e
        self._uid += 1
        meta.update(namespace=ns, uid=f"uid-{self._uid}", creationTimestamp=_now())
        obj["status"] = {}
        self.objects[kind][(ns, name)] = obj
        if kind == "jobs" and self.refuse_pods is not None:
            self._failed_create(obj, self.refuse_pods)
        elif kind == "jobs":
            for index in range(obj["spec"].get("parallelism", 1)):
                self._job_pod(obj, index)
            self._sync(obj)
        if kind == "vcjobs":
            obj["status"] = {"state": {"phase": "Pending"}}
            for task in obj["spec"]["tasks"]:
                self._volcano_pod(obj, task)
        self._cond.notify_all()
        return obj

    def _failed_create(self, job: Obj, message: str) -> None:
        """The Job controller's event when admission refuses a pod of ``job``."""
        meta = job["metadata"]
        name = f"{meta['name']}.{meta['uid']}"
        self.objects["events"][(meta["namespace"], name)] = {
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Job", "name": meta["name"], "uid": meta["uid"]},
            "reason": "FailedCreate",
            "type": "Warning",
            "message": f"Error creating: {message}",
            "lastTimestamp": _now(),
        }

    def _delete(self, kind: str, ns: str, name: str, policy: Optional[str]) -> None:
        obj = self.objects[kind].pop((ns, name))
        uid = obj["metadata"]["uid"]
        for dep_kind in ("pods", "services", "secrets", "networkpolicies"):
            for key, dep in list(self.objects[dep_kind].items()):
                owners = dep["metadata"].get("ownerReferences") or []
                if any(o["uid"] == uid for o in owners):
                    if policy in ("Background", "Foreground"):
                        del self.objects[dep_kind][key]
                    else:  # batch/v1 Jobs orphan their dependents by default
                        dep["metadata"]["ownerReferences"] = []
        self._cond.notify_all()

    # -- controllers ----------------------------------------------------------------------

    def _pod(self, owner: Obj, name: str, template: Obj, extra_labels: Dict[str, str]) -> Obj:
        self._uid += 1
        meta = copy.deepcopy(template.get("metadata") or {})
        meta.setdefault("labels", {}).update(extra_labels)
        meta.update(
            name=name,
            namespace=owner["metadata"]["namespace"],
            uid=f"uid-{self._uid}",
            creationTimestamp=_now(),
            ownerReferences=[
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                }
            ],
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": copy.deepcopy(template["spec"]),
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "True"}],
            },
        }
        self.objects["pods"][(meta["namespace"], name)] = pod
        self.logs[name] = []
        return pod

    def _job_pod(self, job: Obj, index: int, failures: int = 0) -> Obj:
        job_name = job["metadata"]["name"]
        self._tries[(job["metadata"]["uid"], index)] = tries = (
            self._tries.get((job["metadata"]["uid"], index), -1) + 1
        )
        pod = self._pod(
            job,
            f"{job_name}-{index}-{tries:05d}",
            job["spec"]["template"],
            {
                "batch.kubernetes.io/job-name": job_name,
                "job-name": job_name,
                "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                "batch.kubernetes.io/job-completion-index": str(index),
            },
        )
        annotations = pod["metadata"].setdefault("annotations", {})
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
        if "backoffLimitPerIndex" in job["spec"]:
            annotations["batch.kubernetes.io/job-index-failure-count"] = str(failures)
        pod["spec"]["hostname"] = f"{job_name}-{index}"
        for container in pod["spec"]["containers"]:
            container.setdefault("env", []).append(
                {"name": "JOB_COMPLETION_INDEX", "value": str(index)}
            )
        return pod

    def _volcano_pod(self, job: Obj, task: Obj) -> Obj:
        job_name = job["metadata"]["name"]
        pod = self._pod(
            job,
            f"{job_name}-{task['name']}-0",
            task["template"],
            {"volcano.sh/job-name": job_name, "volcano.sh/task-spec": task["name"]},
        )
        pod["spec"].update(hostname=pod["metadata"]["name"], subdomain=job_name)
        return pod

    def _pods_of(self, owner: Obj) -> List[Obj]:
        uid = owner["metadata"]["uid"]
        return [
            p
            for p in self.objects["pods"].values()
            if any(o["uid"] == uid for o in p["metadata"].get("ownerReferences") or [])
        ]

    @staticmethod
    def index_of(pod: Obj) -> int:
        annotations = pod["metadata"].get("annotations") or {}
        return int(annotations.get("batch.kubernetes.io/job-completion-index", -1))

    @staticmethod
    def _ignored(job: Obj, pod: Obj) -> bool:
        """Whether the Job's podFailurePolicy ignores this failure (a disruption, an exit
        code), its first matching rule deciding as the Job controller's does."""
        conditions = {
            c["type"] for c in pod["status"].get("conditions") or [] if c.get("status") == "True"
        }
        codes = {
            (c.get("state") or {}).get("terminated", {}).get("exitCode")
            for c in pod["status"].get("containerStatuses") or []
        }
        for rule in (job["spec"].get("podFailurePolicy") or {}).get("rules") or []:
            wanted = {c["type"] for c in rule.get("onPodConditions") or []}
            on_codes = rule.get("onExitCodes") or {}
            assert on_codes.get("operator", "In") == "In", "the fake knows the In operator only"
            if wanted & conditions or codes & set(on_codes.get("values") or []):
                return bool(rule["action"] == "Ignore")
        return False

    def _sync(self, job: Obj) -> None:
        """The Job controller: counts, replacements, conditions.

        Failed pods are counted once, when first seen (the real controller's finalizer):
        a counted pod that is deleted afterwards still counts.
        """
        pods = self._pods_of(job)
        counted = self._counted.setdefault(job["metadata"]["uid"], [])
        for pod in pods:
            name = pod["metadata"]["name"]
            failed = pod["status"]["phase"] == "Failed"
            if failed and name not in counted and not self._ignored(job, pod):
                counted.append(name)
        index_failures: Dict[int, int] = {}
        for name in counted:
            index = int(name.rsplit("-", 2)[-2])
            index_failures[index] = index_failures.get(index, 0) + 1
        phases = [p["status"]["phase"] for p in pods]
        succeeded = {self.index_of(p) for p in pods if p["status"]["phase"] == "Succeeded"}
        status = job["status"]
        status.update(
            active=sum(ph in ("Pending", "Running") for ph in phases),
            failed=len(counted),
            succeeded=len(succeeded),
        )
        conditions = status.setdefault("conditions", [])
        if conditions:
            return
        spec = job["spec"]
        completions = spec.get("completions", 1)
        per_index = spec.get("backoffLimitPerIndex")
        failed_indexes = set()
        if per_index is not None:
            failed_indexes = {i for i, n in index_failures.items() if n > per_index}
            if failed_indexes:
                status["failedIndexes"] = ",".join(map(str, sorted(failed_indexes)))
        if self._success_criteria_met(job, succeeded):
            conditions.append({"type": "SuccessCriteriaMet", "status": "True"})
            # the real controller removes the lingering pods, then marks the Job Complete
            for pod in pods:
                if pod["status"]["phase"] in ("Pending", "Running"):
                    self._remove_pod(pod)
            conditions.append({"type": "Complete", "status": "True"})
            status["active"] = 0
            return
        failure = None
        if per_index is None and len(counted) > spec.get("backoffLimit", 6):
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        elif len(failed_indexes) > spec.get("maxFailedIndexes", completions):
            failure = (
                "MaxFailedIndexesExceeded",
                "Job has exceeded the specified maximal number of failed indexes",
            )
        if failure is not None:
            reason, message = failure
            conditions.append(
                {"type": "Failed", "status": "True", "reason": reason, "message": message}
            )
            # the real controller deletes the pods still running, logs and all
            for pod in pods:
                if pod["status"]["phase"] in ("Pending", "Running"):
                    self._remove_pod(pod)
            status["active"] = 0
        elif len(succeeded | failed_indexes) == completions:
            if failed_indexes:
                conditions.append(
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "FailedIndexes",
                        "message": "Job has failed indexes",
                    }
                )
            else:
                conditions.append({"type": "Complete", "status": "True"})
        else:
            live = {self.index_of(p) for p in pods if p["status"]["phase"] != "Failed"}
            for index in range(completions):
                if index not in live | succeeded | failed_indexes:
                    self._job_pod(job, index, index_failures.get(index, 0))
                    status["active"] += 1

    @staticmethod
    def _success_criteria_met(job: Obj, succeeded: set[int]) -> bool:
        """Whether one rule of the Job's successPolicy holds (``succeededIndexes`` as a
        comma-separated list of indexes; ranges are not used by the scheduler)."""
        for rule in (job["spec"].get("successPolicy") or {}).get("rules") or []:
            wanted = {int(i) for i in str(rule.get("succeededIndexes", "")).split(",") if i}
            if wanted and wanted <= succeeded:
                return True
        return False

    def _remove_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        self.objects["pods"].pop((meta["namespace"], meta["name"]), None)
        self.logs.pop(meta["name"], None)

    def delete_pod(self, pod: Obj, disruption: bool = False) -> None:
        """``kubectl delete pod`` (or, with ``disruption``, an eviction): the pod's agent is
        stopped (exit code 143), the pod goes, and the Job controller replaces it."""

        def change(p: Obj) -> None:
            if disruption:
                p["status"].setdefault("conditions", []).append(
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "EvictionByEvictionAPI",
                    }
                )
            if p["status"]["phase"] in ("Pending", "Running"):
                self._finish(p, "Failed", 143, "Error")
            job = self._owner_job(p)
            if job is not None:
                self._sync(job)  # counted before it goes, as the controller's finalizer does
            self._remove_pod(p)

        self._update(pod, change)

    def _owner_job(self, pod: Obj) -> Optional[Obj]:
        for owner in pod["metadata"].get("ownerReferences") or []:
            for job in self.objects["jobs"].values():
                if job["metadata"]["uid"] == owner["uid"]:
                    return job
        return None

    def _finish(self, pod: Obj, phase: str, exit_code: int, reason: str) -> None:
        pod["status"]["phase"] = phase
        pod["status"]["containerStatuses"] = [
            {
                "name": c["name"],
                "state": {"terminated": {"exitCode": exit_code, "reason": reason}},
            }
            for c in pod["spec"]["containers"]
        ]

    # -- helpers for tests ----------------------------------------------------------------

    def pods(self, job_name: str) -> List[Obj]:
        """Pods of a job, oldest first."""
        with self._cond:
            return [
                p
                for p in self.objects["pods"].values()
                if p["metadata"]["name"].startswith(f"{job_name}-")
            ]

    def pod(self, job_name: str, index: int) -> Obj:
        """The newest pod of replica ``index`` (completion index or Volcano replica id)."""
        with self._cond:
            pods = [
                p
                for p in self.pods(job_name)
                if self.index_of(p) == index
                or (p["metadata"].get("labels") or {}).get("torchx.pytorch.org/replica-id")
                == str(index)
            ]
            return pods[-1]

    def _update(self, pod: Obj, change: Callable[[Obj], None]) -> None:
        with self._cond:
            change(pod)
            job = self._owner_job(pod)
            if job is not None:
                self._sync(job)
            self._cond.notify_all()

    def set_phase(
        self, pod: Obj, phase: str, exit_code: int = 0, reason: str = "", message: str = ""
    ) -> None:
        """``message``: the container's termination message (what it wrote, or its log's tail)."""

        def change(p: Obj) -> None:
            if phase in ("Succeeded", "Failed"):
                code = exit_code if phase == "Failed" else 0
                self._finish(p, phase, code, reason or ("Completed" if code == 0 else "Error"))
                if message:
                    for status in p["status"]["containerStatuses"]:
                        status["state"]["terminated"]["message"] = message
            else:
                p["status"]["phase"] = phase
                p["spec"]["nodeName"] = "node-1"
                p["status"]["containerStatuses"] = [
                    {"name": c["name"], "state": {"running": {"startedAt": _now()}}}
                    for c in p["spec"]["containers"]
                ]

        self._update(pod, change)

    def wait_image(self, pod: Obj, reason: str = "ImagePullBackOff") -> None:
        """The kubelet cannot pull the pod's image."""
        image = pod["spec"]["containers"][0]["image"]

        def change(p: Obj) -> None:
            p["status"]["containerStatuses"] = [
                {
                    "name": c["name"],
                    "state": {
                        "waiting": {
                            "reason": reason,
                            "message": f'Back-off pulling image "{image}"',
                        }
                    },
                }
                for c in p["spec"]["containers"]
            ]

        self._update(pod, change)

    def unschedulable(self, pod: Obj, message: str) -> None:
        def change(p: Obj) -> None:
            p["status"]["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ]

        self._update(pod, change)

    def write_log(self, pod: Obj, data: bytes, age_s: float = 0) -> None:
        with self._cond:
            at = datetime.now(timezone.utc) - timedelta(seconds=age_s)
            self.logs[pod["metadata"]["name"]].append((at, data))
            self._cond.notify_all()

    def log_chunks(
        self,
        ns: str,
        name: str,
        follow: bool,
        since_s: Optional[int],
        tail_lines: Optional[int] = None,
        timestamps: bool = False,
    ) -> Any:
        """The chunks of a pod's log, waiting for more while following a running pod;
        ``tail_lines`` (not following): the last lines only; ``timestamps``: each line
        after its RFC 3339 time, as the API server writes it."""
        with self._cond:
            pod = self._get("pods", ns, name)
            if pod["status"]["phase"] == "Pending":
                container = pod["spec"]["containers"][0]["name"]
                raise ApiError(
                    400,
                    "BadRequest",
                    f'container "{container}" in pod "{name}" is waiting to start:'
                    " ContainerCreating",
                )
        start = datetime.now(timezone.utc) - timedelta(seconds=since_s) if since_s else None

        def chunks() -> Any:
            sent = 0
            while True:
                with self._cond:
                    entries = self.logs.get(name, [])
                    new, sent = entries[sent:], len(entries)
                    done = pod["status"]["phase"] in ("Succeeded", "Failed") or (
                        (ns, name) not in self.objects["pods"]
                    )
                    if not new and follow and not done:
                        self._cond.wait(timeout=0.5)
                        continue
                for at, data in new:
                    if start is None or at >= start:
                        yield data if not timestamps else _stamped(at, data)
                if not follow or (done and sent == len(self.logs.get(name, []))):
                    return

        if tail_lines is not None and not follow:
            lines = b"".join(chunks()).splitlines(keepends=True)
            return iter([b"".join(lines[-tail_lines:])] if tail_lines else [])
        return chunks()


def _stamped(at: datetime, data: bytes) -> bytes:
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.%f").encode() + b"123Z "
    return b"".join(stamp + line for line in data.splitlines(keepends=True))


class _Handler(BaseHTTPRequestHandler):
    fake: FakeCluster
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> Optional[Obj]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length)) if length else None

    def _send(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _dispatch(self, method: str) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        body = self._body()
        try:
            if method == "GET" and url.path.endswith("/log"):
                self._log(url.path, query)
                return
            result = self.fake.handle(method, url.path, query, body)
            self._send(201 if method == "POST" else 200, result)
        except ApiError as e:
            self._send(e.code, e.status())

    def _log(self, path: str, query: Obj) -> None:
        match = _ROUTES[2][1].fullmatch(path)
        assert match is not None
        self.fake.requests.append(("log", f"pods/{match['name']}"))
        if ("get", "pods") in self.fake.forbidden:
            raise ApiError(403, "Forbidden", 'pods "log" is forbidden')
        since = query.get("sinceSeconds")
        tail = query.get("tailLines")
        # the API server parses booleans like Go: "true", "True", "1", ...
        chunks = self.fake.log_chunks(
            match["ns"],
            match["name"],
            follow=(query.get("follow") or ["false"])[0].lower() in ("true", "t", "1"),
            since_s=int(since[0]) if since else None,
            tail_lines=int(tail[0]) if tail else None,
            timestamps=(query.get("timestamps") or ["false"])[0].lower() in ("true", "t", "1"),
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for data in chunks:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


def main() -> None:
    """``python -m tests.kubernetes.fake_api KUBECONFIG``: serve a fake cluster to poke at
    with ``KUBECONFIG=... torchx run -s kubernetes ...`` until interrupted."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("kubeconfig", type=Path, help="where to write the kubeconfig")
    args = parser.parse_args()
    cluster = FakeCluster()
    cluster.start()
    cluster.write_kubeconfig(args.kubeconfig)
    print(f"fake Kubernetes API at {cluster.url}; KUBECONFIG={args.kubeconfig}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        cluster.stop()


if __name__ == "__main__":
    main()
