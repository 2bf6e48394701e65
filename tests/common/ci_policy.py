"""Under CI=true (.ci/run sets it) a check that would skip for want of a
tool or package fails instead, naming what is missing: CI must run every
check."""
import os

import pytest


def under_ci():
    return os.environ.get("CI", "").lower() in ("true", "1")


def skip_or_fail(why):
    """Skips the test with `why`; under CI fails it with `why`."""
    if under_ci():
        pytest.fail("CI=true: " + why, pytrace=False)
    pytest.skip(why)
