"""``DockerScheduler``: submit, describe, list, log and cancel jobs on a Docker engine.

One network per job (``torchx-<app_id>``), one container per replica on it, named and
hostnamed ``<app_id>-<role>-<replica>``; every replica's ``TORCHX_RANK0_HOST`` names the
replica-0 container, which the others reach by name over the job's network.

``cancel`` stops the job's containers, as torchx's ``local_docker`` does: the job keeps its
status (CANCELLED) and logs. ``delete`` (torchx's development line: ``torchx delete``)
removes its containers and network: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Mapping, Optional

from torchx.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler
from torchx.schedulers.ids import make_unique
from torchx.specs import AppDef, AppDryRunInfo, AppState, CfgVal, is_terminal, runopts

from torchx_elastic.contract import SECRET_ENV, new_secret
from torchx_elastic.schedulers import role_status
from torchx_elastic.schedulers.compat import show_app_as
from torchx_elastic.schedulers.credentials import masked_app, warn_about_credentials
from torchx_elastic.schedulers.docker.errors import (
    ContainerStartError,
    EngineUnreachableError,
    ImageMissingError,
    NameClashError,
)
from torchx_elastic.schedulers.docker.logs import container_log_lines
from torchx_elastic.schedulers.docker.options import DockerOptions
from torchx_elastic.schedulers.docker.request import (
    LABEL_APP_ID,
    LABEL_REPLICA_ID,
    LABEL_ROLE_NAME,
    LABEL_SCHEDULER,
    LABEL_STOP_TIMEOUT_S,
    SCHEDULER_NAME,
    DockerJob,
    build_job,
    cancel_marker_name,
)
from torchx_elastic.schedulers.docker.secret_file import CONTAINER_DIR, file_env, secret_archive
from torchx_elastic.schedulers.docker.status import (
    NOT_SET,
    ContainerSnapshot,
    app_message,
    app_state,
    by_role,
    role_states,
    roles_and_statuses,
    several_roles_app_state,
)
from torchx_elastic.schedulers.progress_status import (
    TAIL_LINES,
    join_message,
    newest_progress,
    replicas_progress,
)
from torchx_elastic.schedulers.replica_logs import LogQuery, ReplicaLogs
from torchx_elastic.schedulers.workspace import WorkspaceImages

if TYPE_CHECKING:
    from docker.models.containers import Container

    from docker import DockerClient

logger = logging.getLogger(__name__)

LOG_TAIL_LINES = 10  # of a failed replica, in torchx status
SECRET_OPTION = "-cfg secret_env_file=PATH (NAME=value lines, kept out of the container's config)"


def connect() -> DockerClient:
    """A client of the engine the environment points at (DOCKER_HOST or the local socket)."""
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        raise EngineUnreachableError(str(e)) from e
    return client


class DockerScheduler(ReplicaLogs, WorkspaceImages, Scheduler[Mapping[str, CfgVal]]):
    """torchx scheduler ``docker``: the job's replicas as containers on one Docker engine.

    With a workspace (``torchx run --workspace``, default: the current directory) the
    first role runs the workspace built as a layer on its image (see ``workspace``).
    """

    def __init__(self, session_name: str, client: Optional[DockerClient] = None) -> None:
        super().__init__(SCHEDULER_NAME, session_name, docker_client=client)
        self._docker: Optional[DockerClient] = client

    @property
    def client(self) -> DockerClient:
        if self._docker is None:
            self._docker = connect()
        return self._docker

    def _run_opts(self) -> runopts:
        return DockerOptions.runopts()

    def workspace_docker_client(self) -> DockerClient:
        return self.client

    def workspace_base_image_id(
        self, client: DockerClient, image: str, cfg: Mapping[str, CfgVal]
    ) -> str:
        self._ensure_image(client, image, DockerOptions.from_cfg(cfg).image_pull)
        base: str = client.images.get(image).id
        return base

    def _validate(self, app: AppDef, scheduler: str, cfg: object = None) -> None:
        """Any resource is fine: a role without one runs without limits. (torchx's
        development line passes the run's ``cfg`` too, 0.7 does not.)"""

    def submit_dryrun(self, app: AppDef, cfg: Any) -> AppDryRunInfo[DockerJob]:
        info = super().submit_dryrun(app, cfg)
        show_app_as(info, masked_app(app))  # the dry run prints no credential
        return info

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, CfgVal]) -> AppDryRunInfo[DockerJob]:
        options = DockerOptions.from_cfg(cfg)
        job = build_job(app, options, make_unique(app.name), os.environ)
        job = dataclasses.replace(job, workspace_builds=self.workspace_builds(app))
        env_names = [*(options.env or {}), *(name for role in app.roles for name in role.env)]
        warn_about_credentials(env_names, "docker", SECRET_OPTION)
        return AppDryRunInfo(job, str)

    # -- submit -------------------------------------------------------------------------

    def schedule(self, dryrun_info: AppDryRunInfo[DockerJob]) -> str:
        job: DockerJob = dryrun_info.request
        client = self.client
        self.build_workspace_images(job.workspace_builds)
        built = {build.image for build in job.workspace_builds}
        for image in job.images:
            if image not in built:
                self._ensure_image(client, image, job.image_pull)
        self._check_names_free(client, job)
        # read now, not in the dry run: a missing file fails before anything is created
        secret_env = secret_archive(job.secret_env_file) if job.secret_env_file else None
        client.networks.create(job.network, driver="bridge", labels=job.network_labels)
        secret = new_secret()  # the job's own (docs/security.md); not in the dry run
        try:
            containers = [
                self._create(client, job, i, secret, secret_env) for i in range(len(job.containers))
            ]
            for index, container in enumerate(containers):
                self._start(job, index, container)
        except BaseException:
            self._remove_job(job.app_id)
            raise
        return job.app_id

    def _ensure_image(self, client: DockerClient, image: str, policy: str) -> None:
        """Use the local image; pull only when it is missing (or always, by option)."""
        from docker.errors import APIError, ImageNotFound

        local = True
        try:
            client.images.get(image)
        except ImageNotFound:
            local = False
        if local and policy != "always":
            return
        if policy == "never":
            raise ImageMissingError(image, "image_pull=never forbids pulling it")
        logger.info("pulling image %s", image)
        try:
            client.images.pull(image)
        except APIError as e:
            if local:
                logger.warning("pulling %s failed, using the local image: %s", image, e)
                return
            raise ImageMissingError(image, f"pulling it failed: {e.explanation or e}") from e

    def _check_names_free(self, client: DockerClient, job: DockerJob) -> None:
        from docker.errors import NotFound

        taken: List[str] = []
        for request in job.containers:
            try:
                client.containers.get(request.name)
                taken.append(request.name)
            except NotFound:
                pass
        if taken:
            raise NameClashError("container", taken)
        try:
            client.networks.get(job.network)
        except NotFound:
            return
        raise NameClashError("network", [job.network])

    def _create(
        self,
        client: DockerClient,
        job: DockerJob,
        index: int,
        secret: str,
        secret_env: Optional[bytes] = None,
    ) -> Container:
        from docker.errors import APIError

        request = job.containers[index]
        kwargs = request.create_kwargs(job.network)
        kwargs["environment"] = {**kwargs["environment"], SECRET_ENV: secret}
        if secret_env is not None:
            kwargs["environment"].update(file_env())
        try:
            container = client.containers.create(**kwargs)
            if secret_env is not None:
                container.put_archive(CONTAINER_DIR, secret_env)
            return container
        except APIError as e:
            if e.status_code == 409:
                raise NameClashError("container", [request.name]) from e
            raise self._start_error(job, index, e) from e

    def _start(self, job: DockerJob, index: int, container: Container) -> None:
        from docker.errors import APIError

        try:
            container.start()
        except APIError as e:
            raise self._start_error(job, index, e) from e

    @staticmethod
    def _start_error(job: DockerJob, index: int, error: Any) -> ContainerStartError:
        request = job.containers[index]
        replica = f"{request.labels[LABEL_ROLE_NAME]}[{request.labels[LABEL_REPLICA_ID]}]"
        detail = str(getattr(error, "explanation", None) or error)
        return ContainerStartError(request.name, replica, request.image, request.command[0], detail)

    # -- query ----------------------------------------------------------------------------

    def _containers(self, app_id: Optional[str] = None) -> List[Container]:
        labels = [f"{LABEL_SCHEDULER}={SCHEDULER_NAME}"]
        if app_id is not None:
            labels.append(f"{LABEL_APP_ID}={app_id}")
        containers: List[Container] = self.client.containers.list(
            all=True, filters={"label": labels}
        )
        return containers

    @staticmethod
    def _snapshot(container: Container) -> ContainerSnapshot:
        snapshot = ContainerSnapshot.from_attrs(container.attrs)
        if snapshot.state == AppState.FAILED and not snapshot.error:
            tail = container.logs(tail=LOG_TAIL_LINES)
            text = tail.decode("utf-8", errors="replace") if isinstance(tail, bytes) else tail
            snapshot = ContainerSnapshot.from_attrs(container.attrs, log_tail=text)
        return snapshot

    @classmethod
    def _progress(
        cls, containers: List[Container], snapshots: List[ContainerSnapshot]
    ) -> Optional[str]:
        """The job's latest progress: the rank-0 agent's last ``[job progress]`` line in the
        tail of replica 0's log (its agent's stderr; or of the next replicas' where replica 0
        stands by), read through the engine."""
        replicas = sorted(
            zip(containers, snapshots, strict=True), key=lambda pair: pair[1].replica_id
        )
        return replicas_progress(
            [
                (
                    f"log of {snapshot.name}",
                    partial(cls._started_log_lines, container, snapshot),
                )
                for container, snapshot in replicas
            ]
        )

    @classmethod
    def _started_log_lines(
        cls, container: Container, snapshot: ContainerSnapshot
    ) -> Optional[List[str]]:
        """:meth:`_log_lines`, None for a container that never started."""
        return None if snapshot.status == "created" else cls._log_lines(container)

    def describe(self, app_id: str) -> Optional[DescribeAppResponse]:
        """The job's state; a FAILED job's containers that still run are stopped.

        Docker has no gang semantics: when too few replicas are left to meet
        ``min_replicas`` the others would wait in the rendezvous until it times out, and
        torchx's ``cancel`` does nothing for a job it sees as FAILED. So the first status
        call that finds the job FAILED stops what is left of it (its logs stay). In an app
        of several roles (``ft.ddp``) a role fails alone: the first call that finds it
        FAILED stops what is left of that role only, the others run on.
        """
        containers = self._containers(app_id)
        snapshots = [self._snapshot(c) for c in containers]
        if not snapshots:
            return None
        cancelled = app_id in self._cancelled()
        roles = by_role(snapshots)
        states = role_states(roles, cancelled)
        if roles:
            state, why = several_roles_app_state(states, cancelled)
        else:
            state, why = app_state(snapshots, cancelled), ""
        msg = app_message(snapshots, self.session_name)
        if cancelled:
            msg = f"cancelled by torchx cancel; {msg}"
        failed_roles = {role for role, s in states.items() if s == AppState.FAILED}
        live = [
            c
            for c, s in zip(containers, snapshots, strict=True)
            if not is_terminal(s.state) and (state == AppState.FAILED or s.role in failed_roles)
        ]
        if live:
            logger.info("job %s failed: stopping its %d live containers", app_id, len(live))
            self._for_each(live, self._stop)
            msg += f"; stopped the {len(live)} replica(s) still running"
            if state != AppState.FAILED:
                msg += f" in {', '.join(sorted(failed_roles))}"
        if roles:
            msg = join_message(msg, self._roles_lines(containers, roles, states, why), NOT_SET)
        else:
            msg = join_message(msg, self._progress(containers, snapshots), NOT_SET)
        torchx_roles, statuses = roles_and_statuses(snapshots)
        return DescribeAppResponse(
            app_id=app_id,
            state=state,
            num_restarts=max(s.restart_count for s in snapshots),
            msg=msg,
            roles=torchx_roles,
            roles_statuses=statuses,
        )

    @staticmethod
    def _log_lines(container: Container) -> List[str]:
        """The tail of a container's log (stderr: the agents' lines), timestamped."""
        tail = container.logs(stdout=False, stderr=True, tail=TAIL_LINES, timestamps=True)
        text = tail.decode("utf-8", errors="replace") if isinstance(tail, bytes) else tail
        return text.splitlines()

    def _roles_lines(
        self,
        containers: List[Container],
        roles: Mapping[str, List[ContainerSnapshot]],
        states: Mapping[str, AppState],
        why: str,
    ) -> str:
        """An app of several roles: why it ended, each role's state and, for ``ft.ddp``, what
        each replica group does (the Lighthouse's last quorum, each group's progress)."""
        by_name = {c.name: c for c in containers}
        tails = {
            role: self._log_lines(by_name[replicas[0].name])
            for role, replicas in roles.items()
            if replicas[0].replica_id == 0 and replicas[0].status != "created"
        }
        first = tails.get(next(iter(roles)))
        progress = {
            role: found for role, lines in tails.items() if (found := newest_progress(lines))
        }
        restarts = {
            role: max(r.restart_count for r in replicas) for role, replicas in roles.items()
        }
        lines = role_status.read(first).roles_lines(states, progress, restarts)
        return "\n".join([why, *lines] if why else lines)

    def list(self, cfg: Optional[Mapping[str, CfgVal]] = None) -> List[ListAppResponse]:
        """Every job of this engine (``cfg``: torchx's development line passes the run
        options; none of them changes what is listed)."""
        by_app: dict[str, List[ContainerSnapshot]] = {}
        for container in self._containers():
            snapshot = ContainerSnapshot.from_attrs(container.attrs)
            by_app.setdefault(snapshot.app_id, []).append(snapshot)
        cancelled = self._cancelled()
        return [
            ListAppResponse(app_id=app_id, state=app_state(snapshots, app_id in cancelled))
            for app_id, snapshots in sorted(by_app.items())
        ]

    def _cancelled(self) -> set[str]:
        """App ids of the jobs ``cancel`` has stopped (their marker volumes)."""
        volumes = self.client.volumes.list(
            filters={"label": [f"{LABEL_SCHEDULER}={SCHEDULER_NAME}", LABEL_APP_ID]}
        )
        return {volume.attrs["Labels"][LABEL_APP_ID] for volume in volumes}

    def replica_log(self, app_id: str, role_name: str, k: int, query: LogQuery) -> Iterable[str]:
        containers = self._containers(app_id)
        for container in containers:
            labels = container.labels
            if labels[LABEL_ROLE_NAME] == role_name and labels[LABEL_REPLICA_ID] == str(k):
                return container_log_lines(
                    container, query.regex, query.since, query.until, query.follow, query.streams
                )
        replicas = sorted(
            f"{c.labels[LABEL_ROLE_NAME]}/{c.labels[LABEL_REPLICA_ID]}" for c in containers
        )
        raise ValueError(
            f"job {app_id} has no replica {role_name}/{k}; its replicas:"
            f" {', '.join(replicas) or 'none (cancelled or never submitted)'}"
        )

    # -- cancel ---------------------------------------------------------------------------

    def cancel(self, app_id: str) -> None:
        """Stop the job's containers; its status (CANCELLED) and logs stay. Idempotent.

        A job that has already ended is left as it is (it keeps SUCCEEDED or FAILED).
        """
        containers = self._containers(app_id)
        snapshots = [ContainerSnapshot.from_attrs(c.attrs) for c in containers]
        if not snapshots or is_terminal(app_state(snapshots)):
            return
        self.client.volumes.create(
            name=cancel_marker_name(app_id),
            labels={LABEL_SCHEDULER: SCHEDULER_NAME, LABEL_APP_ID: app_id},
        )
        self._for_each(containers, self._stop)

    def _cancel_existing(self, app_id: str) -> None:
        self.cancel(app_id)

    def delete(self, app_id: str) -> None:
        """Remove the job: stop and remove its containers and network; idempotent.

        torchx's development line calls this for ``torchx delete``; nothing of the job is
        left behind (its logs go with its containers).
        """
        self._remove_job(app_id)

    def _delete_existing(self, app_id: str) -> None:
        self._remove_job(app_id)

    @staticmethod
    def _for_each(containers: List[Container], action: Callable[[Container], None]) -> None:
        if containers:
            with ThreadPoolExecutor(max_workers=min(len(containers), 16)) as pool:
                list(pool.map(action, containers))

    @staticmethod
    def _stop(container: Container) -> None:
        """docker stop: SIGTERM, then SIGKILL after the job's stop timeout.

        A stopped container is not restarted by its restart policy.
        """
        from docker.errors import NotFound

        with contextlib.suppress(NotFound):
            container.stop(timeout=int(container.labels.get(LABEL_STOP_TIMEOUT_S, 10)))

    @classmethod
    def _stop_and_remove(cls, container: Container) -> None:
        from docker.errors import NotFound

        cls._stop(container)
        with contextlib.suppress(NotFound):
            container.remove(force=True)

    def _remove_job(self, app_id: str) -> None:
        from docker.errors import NotFound

        self._for_each(self._containers(app_id), self._stop_and_remove)
        networks = self.client.networks.list(
            filters={"label": [f"{LABEL_SCHEDULER}={SCHEDULER_NAME}", f"{LABEL_APP_ID}={app_id}"]}
        )
        for network in networks:
            with contextlib.suppress(NotFound):
                network.remove()
        volumes = self.client.volumes.list(
            filters={"label": [f"{LABEL_SCHEDULER}={SCHEDULER_NAME}", f"{LABEL_APP_ID}={app_id}"]}
        )
        for volume in volumes:
            with contextlib.suppress(NotFound):
                volume.remove(force=True)


def create_scheduler(
    session_name: str, client: Optional[DockerClient] = None, **kwargs: Any
) -> DockerScheduler:
    """torchx's ``torchx.schedulers`` entry point; ``client`` (or torchx's ``docker_client``)
    lets tests pass a fake engine."""
    return DockerScheduler(session_name, client=client or kwargs.get("docker_client"))
