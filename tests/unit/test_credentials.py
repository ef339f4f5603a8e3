"""Credential-looking --env names: one warning line naming the secret option, masked dry runs;
the env file format the agent reads (docker's secret_env_file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchx_elastic.components.dist import ddp
from torchx_elastic.contract import ENV_FILE_ENV
from torchx_elastic.contract.env_file import load_env_file, parse_env_file
from torchx_elastic.schedulers.credentials import looks_like_credential
from torchx_elastic.schedulers.docker import DockerScheduler
from torchx_elastic.schedulers.kubernetes.scheduler import KubernetesScheduler

ENV = {"WANDB_API_KEY": "k-123", "HF_TOKEN": "t-456", "WANDB_MODE": "offline"}


def test_names_that_look_like_credentials() -> None:
    names = ("A_KEY", "hf_token", "X_SECRET", "DB_PASSWORD", "KEYS", "TOKENIZER")
    found = [n for n in names if looks_like_credential(n)]
    assert found == ["A_KEY", "hf_token", "X_SECRET", "DB_PASSWORD"]


def test_kubernetes_warns_once_and_masks_the_dry_run(caplog: pytest.LogCaptureFixture) -> None:
    app = ddp(script="main.py", j="2x1", env=ENV)
    info = KubernetesScheduler("t", suffix=lambda: "bcdfghjk").submit_dryrun(app, {})
    assert caplog.messages == [
        "--env HF_TOKEN, WANDB_API_KEY: a credential in plain text in the kubernetes job's"
        " spec (its dry run masks it); pass it with -cfg secret_env=NAME:secret/key"
        " (a Kubernetes Secret) instead"
    ]
    text = str(info)
    assert "k-123" not in text and "t-456" not in text
    assert "name: WANDB_API_KEY\n          value: <masked>" in text
    assert "name: WANDB_MODE\n          value: offline" in text
    env = info.request.manifests[0]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "WANDB_API_KEY", "value": "k-123"} in env  # what is created: the value


def test_docker_warns_once_and_masks_the_dry_run(caplog: pytest.LogCaptureFixture) -> None:
    app = ddp(script="main.py", j="2x1", env=ENV)
    info = DockerScheduler("t").submit_dryrun(app, {})
    assert caplog.messages == [
        "--env HF_TOKEN, WANDB_API_KEY: a credential in plain text in the docker job's spec"
        " (its dry run masks it); pass it with -cfg secret_env_file=PATH (NAME=value lines,"
        " kept out of the container's config) instead"
    ]
    text = str(info)
    assert "k-123" not in text and "WANDB_API_KEY: <masked>" in text
    assert "WANDB_MODE: offline" in text
    assert info.request.containers[0].environment["WANDB_API_KEY"] == "k-123"


def test_no_warning_without_credentials(caplog: pytest.LogCaptureFixture) -> None:
    app = ddp(script="main.py", j="2x1", env={"WANDB_MODE": "offline"})
    KubernetesScheduler("t", suffix=lambda: "bcdfghjk").submit_dryrun(app, {})
    DockerScheduler("t").submit_dryrun(app, {})
    assert caplog.messages == []


def test_env_file_format_is_dockers(tmp_path: Path) -> None:
    text = "# comment\n\nA=1\nB=x=y \nFROM_HOST\nUNSET_ON_HOST\n  C=\n"
    assert parse_env_file(text, {"FROM_HOST": "h"}) == {
        "A": "1", "B": "x=y ", "FROM_HOST": "h", "C": "",
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"^line 2: expected NAME=value, got 'BAD NAME=1'$"):
        parse_env_file("A=1\nBAD NAME=1\n", {})
    path = tmp_path / "secret.env"
    path.write_text("WANDB_API_KEY=k-123\n")
    environ = {ENV_FILE_ENV: str(path)}
    load_env_file(environ)
    assert environ["WANDB_API_KEY"] == "k-123"
    untouched = {"OTHER": "1"}
    load_env_file(untouched)
    assert untouched == {"OTHER": "1"}
