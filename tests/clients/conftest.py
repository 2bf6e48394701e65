"""Programs other people wrote, run unchanged on fastpar (2 CPU ranks) and on
gloo, each rank comparing its own results. The whole folder is skipped, with
the reason, when a client package is missing: `bash scripts/setup.sh`
installs them (the versions below are the ones these tests were written
against). Under CI=true (.ci/run) a missing package fails every test here
instead: CI must run them."""
import importlib.util
import os
import sys

import pytest
from ci_policy import under_ci

sys.path.insert(0, os.path.dirname(__file__))

CLIENT_PACKAGES = {"lightning": "lightning==2.6.6", "accelerate": "accelerate==1.15.0"}


def pytest_collection_modifyitems(config, items):
    missing = [spec for name, spec in CLIENT_PACKAGES.items() if importlib.util.find_spec(name) is None]
    if not missing:
        return
    reason = (f"tests/clients needs {', '.join(missing)} "
              f"(pip install {' '.join(missing)}, or bash scripts/setup.sh)")
    if under_ci():
        config._fastpar_clients_missing = reason  # _fail_in_ci fails each test with it
        return
    skip = pytest.mark.skip(reason=reason)
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fail_in_ci(request):
    reason = getattr(request.config, "_fastpar_clients_missing", None)
    if reason:
        pytest.fail("CI=true: " + reason, pytrace=False)
