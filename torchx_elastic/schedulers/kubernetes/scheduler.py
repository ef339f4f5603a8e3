"""The kubernetes scheduler: submit, status, logs, cancel and list on top of the modules
that build requests (``manifests``), map states (``status``) and read logs (``logs``)."""

from __future__ import annotations

import copy
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional

from torchx.schedulers.api import (
    AppDryRunInfo,
    DescribeAppResponse,
    ListAppResponse,
    Scheduler,
    Stream,
    filter_regex,
)
from torchx.specs import AppDef, AppState, CfgVal, runopts

from torchx_elastic.schedulers import credentials
from torchx_elastic.schedulers.compat import show_app_as
from torchx_elastic.schedulers.kubernetes import admission, job_access, manifests, role_jobs, status
from torchx_elastic.schedulers.kubernetes import names as job_names
from torchx_elastic.schedulers.kubernetes.client import (
    KubeApi,
    KubernetesError,
    current_namespace,
    load_api_client,
)
from torchx_elastic.schedulers.kubernetes.logs import since_seconds
from torchx_elastic.schedulers.kubernetes.names import JobNames, parse_app_id
from torchx_elastic.schedulers.kubernetes.options import BACKEND_VOLCANO, KubernetesOptions
from torchx_elastic.schedulers.kubernetes.request import KubernetesRequest
from torchx_elastic.schedulers.log_lines import whole_lines
from torchx_elastic.schedulers.names import dns_label
from torchx_elastic.schedulers.progress_status import (
    TAIL_LINES,
    join_message,
    newest_progress,
    replicas_progress,
)
from torchx_elastic.schedulers.replica_logs import LogQuery, ReplicaLogs
from torchx_elastic.schedulers.workspace import WorkspaceImages

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from docker import DockerClient

logger = logging.getLogger(__name__)

Cfg = Mapping[str, CfgVal]
Obj = Dict[str, Any]
LOG_POLL_INTERVAL_S = 1.0
SECRET_OPTION = "-cfg secret_env=NAME:secret/key (a Kubernetes Secret)"


def build_request(app: AppDef, options: KubernetesOptions, suffix: str) -> KubernetesRequest:
    """The request of ``app``: pure, so that a fixed suffix gives the same YAML every time."""
    if options.backend == BACKEND_VOLCANO:
        tasks = [manifests.volcano_task_name(r, r.num_replicas - 1) for r in app.roles]
        names = JobNames.create(app.name, options.namespace, suffix, 3 + max(map(len, tasks)))
        return KubernetesRequest(options.backend, names, manifests.volcano_job(app, options, names))
    if len(app.roles) > 1:  # one Indexed Job per role
        names = JobNames.create(app.name, options.namespace, suffix, role_jobs.longest_child(app))
        return KubernetesRequest(options.backend, names, role_jobs.role_jobs(app, options, names))
    longest_index = len(str(max(role.num_replicas for role in app.roles) - 1))
    names = JobNames.create(app.name, options.namespace, suffix, 1 + longest_index)
    return KubernetesRequest(options.backend, names, manifests.indexed_job(app, options, names))


class KubernetesScheduler(ReplicaLogs, WorkspaceImages, Scheduler[Cfg]):
    """Runs torchx apps as Indexed Jobs (default) or Volcano Jobs.

    ``client`` is a ``kubernetes.client.ApiClient`` (default: from the current kubeconfig
    context, or in-cluster); ``namespace`` is where ``list`` looks (default: the
    context's namespace); ``suffix`` makes the unique part of job names (tests fix it).
    With a workspace (``torchx run --workspace``, default: the current directory) the
    first role runs the workspace built on its image and pushed to ``image_repo``;
    ``docker_client`` is the engine that builds and pushes it.
    """

    push_workspace_images = True

    def __init__(
        self,
        session_name: str,
        client: Optional[ApiClient] = None,
        namespace: Optional[str] = None,
        suffix: Optional[Callable[[], str]] = None,
        sleep: Callable[[float], None] = time.sleep,
        docker_client: Optional[DockerClient] = None,
    ) -> None:
        super().__init__("kubernetes", session_name, docker_client=docker_client)
        self._client = client
        self._namespace = namespace
        self._suffix = suffix
        self._sleep = sleep
        # jobs this process deleted because the cluster refused their pods: later calls
        # (`torchx run --wait` after run's first status) still read why they failed
        self._refused_jobs: Dict[str, DescribeAppResponse] = {}

    def _api(self) -> KubeApi:
        if self._client is None:
            self._client = load_api_client()
        return KubeApi(self._client)

    def _run_opts(self) -> runopts:
        return KubernetesOptions.runopts()

    def _validate(self, app: AppDef, scheduler: str, cfg: object = None) -> None:
        """A role without resources runs with none requested, as kubectl would. (torchx's
        development line passes the run's ``cfg`` too, 0.7 does not.)"""

    def submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[KubernetesRequest]:
        info = super().submit_dryrun(app, cfg)
        show_app_as(info, credentials.masked_app(app))  # the dry run prints no credential
        return info

    def _submit_dryrun(self, app: AppDef, cfg: Cfg) -> AppDryRunInfo[KubernetesRequest]:
        suffix = self._suffix() if self._suffix else job_names.new_suffix()
        images_to_push = self.dryrun_push_images(app, cfg)  # renames local image ids
        request = build_request(app, KubernetesOptions.from_cfg(cfg), suffix)
        env_names = [name for role in app.roles for name in role.env]
        credentials.warn_about_credentials(env_names, "kubernetes", SECRET_OPTION)
        request.workspace_builds = self.workspace_builds(app)
        request.images_to_push = images_to_push
        return AppDryRunInfo(request, str)

    def schedule(self, dryrun_info: AppDryRunInfo[KubernetesRequest]) -> str:
        request: KubernetesRequest = dryrun_info.request
        self.build_workspace_images(request.workspace_builds)
        self.push_images(request.images_to_push)
        api = self._api()
        names = request.names
        server_version = api.server_version()
        try:
            owner = api.create(manifests.for_server(request.manifests[0], server_version))
        except KubernetesError as e:
            raise self._clash(e, names, "Job") from e
        for dependent in request.manifests[1:]:
            manifest = job_access.with_fresh_secret(copy.deepcopy(dependent))
            manifest = manifests.for_server(manifest, server_version)  # another role's Job
            # the Service goes when its Job goes, however the Job is deleted
            manifest["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                }
            ]
            try:
                api.create(manifest)
            except KubernetesError as e:
                api.delete_job(names.namespace, names.job)
                raise self._clash(e, names, manifest["kind"]) from e
        return names.app_id

    def _clash(self, error: KubernetesError, names: JobNames, kind: str) -> KubernetesError:
        if error.status != 409:
            return error
        return KubernetesError(
            f"a {kind} named {names.job} already exists in namespace {names.namespace};"
            " names are unique per run, so this request was submitted before."
            f" See it with `torchx status kubernetes://{self.session_name}/{names.app_id}`"
            " or submit the app again for a new name",
            409,
        )

    def _read(self, app_id: str) -> Optional[tuple[str, Obj]]:
        """(backend, object) of a job, or None if there is none (any more)."""
        namespace, name = parse_app_id(app_id)
        api = self._api()
        try:
            return "job", api.read_job(namespace, name)
        except KubernetesError as e:
            if e.status != 404:
                raise
        try:
            return BACKEND_VOLCANO, api.read_volcano_job(namespace, name)
        except KubernetesError as e:
            if e.status != 404:
                raise
        return None

    def _pods(self, app_id: str) -> List[Obj]:
        namespace, name = parse_app_id(app_id)
        return self._api().list_pods(namespace, manifests.selector(JobNames(name, namespace)))

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        found = self._read(app_id)
        if found is None:
            return self._refused_jobs.get(app_id)
        backend, job = found
        pods = self._pods(app_id)
        if backend == BACKEND_VOLCANO:
            described = status.describe_volcano_job(app_id, job, pods)
        elif role_jobs.role_job_names(job):
            jobs = self._role_jobs(app_id, job)
            reasons = (self._refusal(j, role_jobs.pods_of(j, pods)) for j in jobs)
            reason = next((r for r in reasons if r is not None), None)
            if reason is not None:
                return self._refused(
                    app_id, role_jobs.describe_role_jobs(app_id, jobs, pods), reason
                )
            return self._describe_role_jobs(app_id, jobs, pods)
        else:
            described = status.describe_job(app_id, job, pods)
            reason = self._refusal(job, pods)
            if reason is not None:
                return self._refused(app_id, described, reason)
        described.msg = join_message(described.msg, self._progress(app_id, pods))
        return described

    def _refusal(self, job: Obj, pods: List[Obj]) -> Optional[str]:
        """Why admission refuses pods of ``job`` (its ``pods``), if it does."""
        if not admission.pods_missing(job, pods):
            return None
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        try:
            events = self._api().list_events(namespace, admission.job_events_selector(name))
        except KubernetesError as e:  # not allowed to read events: the status says the rest
            logger.debug("no events of job %s: %s", name, e)
            return None
        uid = str(job["metadata"].get("uid") or "")
        return admission.refusal(events, uid, since=admission.newest_pod_created(pods))

    def _refused(
        self, app_id: str, described: DescribeAppResponse, reason: str
    ) -> DescribeAppResponse:
        """FAILED with the reason; the app's Jobs are deleted: the Job controller would
        retry in vain and hold the job's name and Service."""
        try:
            self._cancel_existing(app_id)
            deleted = True
        except KubernetesError as e:  # e.g. not allowed to delete Jobs: the reason still counts
            logger.warning("could not delete the refused job %s: %s", app_id, e)
            deleted = False
        described.state = AppState.FAILED
        described.msg = admission.refused_message(reason, deleted)
        self._refused_jobs[app_id] = described
        return described

    def _role_jobs(self, app_id: str, first: Obj) -> List[Obj]:
        """The Jobs of an app of several roles, the first role's first (a Job the API
        does not list any more, e.g. deleted by hand, is left out)."""
        namespace, name = parse_app_id(app_id)
        found = self._api().list_jobs(namespace, manifests.selector(JobNames(name, namespace)))
        by_name = {job["metadata"]["name"]: job for job in found}
        others = [by_name[n] for n in role_jobs.role_job_names(first) if n in by_name]
        return [first, *others]

    def _pod0_log_tail(self, app_id: str, pods: List[Obj], role: str) -> Optional[List[str]]:
        """The tail of ``role``'s pod 0's log (timestamped), None when it has none yet."""
        pod = status.latest_pods(pods).get((role, 0))
        return None if pod is None else self._log_tail(app_id, pod)

    def _describe_role_jobs(
        self, app_id: str, jobs: List[Obj], pods: List[Obj]
    ) -> DescribeAppResponse:
        """An app of several role Jobs, with ``ft.ddp``'s Lighthouse's last quorum (the first
        role's pod 0's log) and each replica group's progress (its pod 0's log)."""
        roles = [role_jobs.first_role_name(job) for job in jobs]
        tails = {role: self._pod0_log_tail(app_id, pods, role) for role in roles}
        first = tails[roles[0]]
        progress = {
            role: found
            for role, lines in list(tails.items())[1:]
            if lines is not None and (found := newest_progress(lines)) is not None
        }
        return role_jobs.describe_role_jobs(app_id, jobs, pods, first, progress)

    def _progress(self, app_id: str, pods: List[Obj]) -> Optional[str]:
        """The job's latest progress: the rank-0 agent's last ``[job progress]`` line in the
        tail of replica 0's pod log (or of the next replicas' where replica 0 stands by), read
        through the API server (``progress_status.py``)."""
        latest = sorted(status.latest_pods(pods).items())
        if not latest:
            return None
        role = latest[0][0][0]
        return replicas_progress(
            [
                (f"log of pod {pod['metadata']['name']}", partial(self._log_tail, app_id, pod))
                for (name, _), pod in latest
                if name == role
            ]
        )

    def _log_tail(self, app_id: str, pod: Obj) -> Optional[List[str]]:
        """The tail of ``pod``'s log (timestamped), None when it has none yet."""
        if (pod.get("status") or {}).get("phase") in (None, "Pending"):
            return None
        namespace, _ = parse_app_id(app_id)
        try:
            text = self._api().pod_log_tail(namespace, pod["metadata"]["name"], TAIL_LINES)
        except KubernetesError as e:  # gone, or not allowed: the status says the rest
            logger.debug("no log of pod %s: %s", pod["metadata"]["name"], e)
            return None
        return text.splitlines()

    def list(self, cfg: Optional[Cfg] = None) -> List[ListAppResponse]:
        """The jobs of the namespace (``cfg``'s, which torchx's development line passes)."""
        given = (cfg or {}).get("namespace")
        namespace = str(given) if given else self._namespace or current_namespace()
        selector = manifests.MANAGED_BY_SELECTOR
        apps = []
        for job in self._api().list_jobs(namespace, selector):
            if role_jobs.is_part(job):  # listed with the app's first Job
                continue
            state, _ = status.job_state(job, any_running=bool(job.get("status", {}).get("active")))
            apps.append(
                ListAppResponse(app_id=f"{namespace}:{job['metadata']['name']}", state=state)
            )
        return apps

    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = parse_app_id(app_id)
        found = self._read(app_id)
        api = self._api()
        if found is not None and found[0] == BACKEND_VOLCANO:
            api.delete_volcano_job(namespace, name)
            return
        api.delete_job(namespace, name)
        for part in role_jobs.role_job_names(found[1]) if found is not None else []:
            api.delete_job(namespace, part)  # owned by the first: gone with it, but at once
        try:
            api.delete_service(namespace, name)
        except KubernetesError as e:
            if e.status != 404:  # already collected with its Job
                raise

    def _replica_pod(
        self, app_id: str, role_name: str, k: int, wait: bool
    ) -> tuple[Optional[Obj], str]:
        """The newest pod of a replica, or None and why there is none to read."""
        replica = f"replica {role_name}/{k} of {app_id}"
        while True:
            pods = status.latest_pods(self._pods(app_id))
            # pods carry the role name as a label value: as the user typed it or normalized
            pod = pods.get((role_name, k)) or pods.get((dns_label(role_name, fallback="worker"), k))
            started = pod is not None and (pod.get("status") or {}).get("phase") != "Pending"
            if started or (pod is not None and not wait):
                return pod, ""
            found = self._read(app_id)
            if pod is None and (not wait or found is None or self._finished(found)):
                others = ", ".join(f"{r}/{i}" for r, i in sorted(pods)) or "none"
                if found is None:
                    why = "the job does not exist (any more)"
                elif self._finished(found):
                    why = status.POD_DELETED
                else:
                    why = "not created yet"
                return None, f"{replica} has no pod: {why} (replicas with a pod: {others})"
            if pod is not None and status.pod_problems(pod):
                return None, f"{replica} has not started: " + "; ".join(status.pod_problems(pod))
            self._sleep(LOG_POLL_INTERVAL_S)

    @staticmethod
    def _finished(found: tuple[str, Obj]) -> bool:
        backend, job = found
        if backend == BACKEND_VOLCANO:
            return False
        state, _ = status.job_state(job, any_running=False)
        return state in (AppState.SUCCEEDED, AppState.FAILED)

    def replica_log(self, app_id: str, role_name: str, k: int, query: LogQuery) -> Iterable[str]:
        if query.until is not None:
            raise ValueError("the kubernetes scheduler cannot stop logs at a time (until)")
        if query.streams not in (None, Stream.COMBINED):
            raise ValueError(
                f"the kubernetes scheduler has one combined log stream, not {query.streams}"
            )
        namespace, _ = parse_app_id(app_id)
        pod, why_none = self._replica_pod(app_id, role_name, k, wait=query.follow)
        if pod is None:
            # said in the log itself: torchx prints a failing log thread as tracebacks
            return iter([f"torchx-elastic: {why_none}\n"])
        if pod["status"].get("phase") == "Pending" and not query.follow:
            problems = status.pod_problems(pod)
            if problems:
                replica = f"replica {role_name}/{k} of {app_id}"
                return iter([f"torchx-elastic: {replica} has not started: {'; '.join(problems)}\n"])
            return iter(())
        response = self._api().pod_log(
            namespace,
            pod["metadata"]["name"],
            follow=query.follow,
            since_seconds=since_seconds(query.since),
        )
        lines = whole_lines(response.stream(decode_content=True))
        return filter_regex(query.regex, lines) if query.regex else lines
