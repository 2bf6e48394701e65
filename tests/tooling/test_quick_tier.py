"""The quick tier's table (tests/common/quick_tier.py) covers every collective
of the torch.distributed front on each engine and every list op on CPU and
CUDA tensors, reading both lists from the code (backend.h, fastpar/comm.py):
a new collective or list op fails here until the table names a test of it.
That the table's entries name existing tests is checked by conftest.py on
every run."""
import os

import pytest

import quick_tier as qt


def test_the_lists_come_from_the_code():
    assert {"allreduce", "broadcast", "alltoall_base", "send", "recvAnysource", "monitoredBarrier"} <= qt.collectives()
    assert not qt.NOT_COLLECTIVES - qt.front_methods(), \
        f"NOT_COLLECTIVES names methods backend.h no longer has: {sorted(qt.NOT_COLLECTIVES - qt.front_methods())}"
    assert {"allreduce", "broadcast_coalesced", "reduce_scatter", "gather"} <= qt.list_ops()


def check_family(family, every, what):
    """The table's entries cover every name of `every` on `family`, but the
    ones UNTESTED names (which the table must not cover, and which must be
    names of `every`)."""
    untested = set(qt.UNTESTED.get(family, {}))
    missing = every - qt.covered(family) - untested
    assert not missing, f"no test of the quick tier runs the {what} {sorted(missing)} on {family}"
    assert not untested & qt.covered(family), f"UNTESTED[{family!r}] names what the table covers: " \
                                                f"{sorted(untested & qt.covered(family))}"
    assert untested <= every, f"UNTESTED[{family!r}] names no {what}: {sorted(untested - every)}"


@pytest.mark.parametrize("engine", qt.ENGINES)
def test_every_collective_on_every_engine(engine):
    check_family(engine, qt.collectives(), "collectives")


@pytest.mark.parametrize("family", qt.LIST_OPS)
def test_every_list_op_on_cpu_and_cuda(family):
    check_family(family, qt.list_ops(), "list ops")


def test_every_feature_once():
    named = {f for touches in qt.QUICK.values() for f in touches.get("features", ())}
    assert set(qt.FEATURES) <= named, f"features without a quick test: {sorted(set(qt.FEATURES) - named)}"


def test_entries_name_what_they_touch_and_leave_out_the_slow_tiers():
    families = set(qt.ENGINES) | set(qt.LIST_OPS) | {"features"}
    for entry, touches in qt.QUICK.items():
        assert touches and set(touches) <= families, (entry, touches)
        for family, names in touches.items():
            if family == "features":
                assert set(names) <= set(qt.FEATURES), (entry, names)
            else:
                every = qt.collectives() if family in qt.ENGINES else qt.list_ops()
                assert set(names) <= every, f"{entry}: {sorted(set(names) - every)} are not {family} names"
        path = entry.split("::")[0]
        assert os.path.isfile(os.path.join(qt.TESTS, path)), entry
        assert path.split("/")[0] not in ("clients", "multihost"), f"{entry}: the full run's tier"
        assert "soak" not in entry, entry
    ids = ["c10d/test_x.py::test_a[cpu-2]", "c10d/test_x.py::test_ab[cpu-2]"]
    assert qt._matches("c10d/test_x.py::test_a", ids[0]) and not qt._matches("c10d/test_x.py::test_a", ids[1])
    assert qt._matches("c10d/test_x.py", ids[1]) and not qt._matches("c10d/test_x.py::test_a[cpu-3]", ids[0])
