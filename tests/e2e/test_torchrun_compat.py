"""torchrun's documented command lines run unchanged through ``python -m torchx_elastic.agent``.

Each form of ``compat_forms.py`` (torch.distributed.run's module docs and ``torchrun
--help``) runs through the real ``torchrun`` of this environment and through our agent, with
the same arguments, environment and working-directory layout; the workers record what they
got. The two must agree on:

- every node's exit code;
- which workers ran, in which attempt, and, for each, the environment the launcher set
  (every variable added, changed or removed, with ports, run ids, temporary paths and our
  own ``TORCHX_ELASTIC_*`` made uniform), ``sys.argv``, working directory, interpreter
  and whether stdout writes through (``python -u``);
- the values every worker of an attempt shares (MASTER_ADDR, MASTER_PORT, the run id);
- which worker lines reach the launcher's stdout and stderr (``-r``, ``-t``,
  ``--local-ranks-filter``), with the same line prefix where
  ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` asks for one;
- worker lines torchrun keeps in files under ``--log-dir`` are in ours too;
- the ``OMP_NUM_THREADS`` warning, once per node where torchrun gives it;
- usage errors: the same exit code, and a message naming what was wrong.

Forms of flags that the installed torchrun does not have yet (``needs``) are not collected:
they are not torchrun command lines on that torch release.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.compat_forms import (
    FORMS,
    Form,
    torchrun_default_port_is_fixed,
    torchrun_flags,
    uses_default_rendezvous,
)
from tests.e2e.compat_runner import (
    record_differences,
    run_both,
    shared_values,
)

pytestmark = pytest.mark.slow


COLLECTED = [form for form in FORMS if set(form.needs) <= torchrun_flags()]

# The forms the extra torch releases run (make test-torch-versions, -m torchrun_sample): one
# of each kind (c10d, static one and two nodes, elastic, module, no-python, restart,
# failure, defaults, usage errors); the main run (make test) runs every form.
SAMPLE = frozenset(
    {
        "docs-single-node",
        "docs-fault-tolerant-2-nodes",
        "docs-elastic-1-to-2-two-nodes",
        "defaults-nothing",
        "static-one-node-master-port",
        "static-2-nodes-classic",
        "module-short",
        "no-python-shell-script",
        "max-restarts-fail-once",
        "failure-restarts-exhausted",
        "failure-2-nodes",
        "signals-to-handle",
        "error-nnodes-min-above-max",
        "error-unknown-flag",
        "log-line-prefix-template-flag",
        "log-line-prefix-template-hostname-env",
        "rdzv-conf-cas-backoff-2-nodes",
    }
)


def _params(forms: list[Form]) -> list[object]:
    marks = {True: [pytest.mark.torchrun_sample], False: []}
    return [pytest.param(form, id=form.id, marks=marks[form.id in SAMPLE]) for form in forms]


def test_sample_names_existing_forms() -> None:
    assert not SAMPLE - {form.id for form in FORMS}, "unknown form ids in SAMPLE"


@pytest.mark.parametrize("form", _params(COLLECTED))
def test_form_gives_workers_what_torchrun_gives(form: Form, tmp_path: Path) -> None:
    # on a fixed port (torchrun's default on older releases), the launchers take turns
    fixed_port = uses_default_rendezvous(form) and torchrun_default_port_is_fixed()
    torchrun, ours = run_both(form.nodes, tmp_path, together=form.together and not fixed_port)
    both = f"{torchrun.describe()}\n{ours.describe()}"

    assert ours.exit_codes == torchrun.exit_codes, both
    if form.error_mentions is not None:
        assert torchrun.exit_codes != [0] * len(form.nodes), both
        stderr = "".join(ours.stderr).lower()
        assert form.error_mentions.lower() in stderr, both
        assert not ours.records, "a usage error must start no worker"
        return

    assert torchrun.records, f"torchrun started no worker:\n{both}"
    differences = record_differences(torchrun, ours)
    assert not differences, "\n".join(differences)
    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        assert shared_values(ours, key) == shared_values(torchrun, key), key

    for stream in ("stdout", "stderr"):
        assert ours.console_markers(stream) == torchrun.console_markers(stream), (stream, both)
    assert torchrun.file_markers() <= ours.file_markers()
    assert ours.omp_warnings() == torchrun.omp_warnings(), both
    if form.compare_line_prefix:
        expected = torchrun.marker_lines()
        assert {m: ours.marker_lines().get(m) for m in expected} == expected
