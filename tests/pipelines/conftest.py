"""The KFP tests need the ``kfp`` SDK, in a venv of its own (``make test-kfp``: KFP 2.x pins
an older ``kubernetes`` client than this package's); where it is not installed they are not
collected."""

import importlib.util

if importlib.util.find_spec("kubernetes_validate"):  # the main venv (not KFP's)
    from tests.kubernetes.conftest import fake  # noqa: F401  (the fake API server: a fixture)

collect_ignore = [] if importlib.util.find_spec("kfp") else ["test_kfp_compile.py", "kfp_steps.py"]
