"""The covering-array generator of the GPU test matrices (covering.py): every
pair of parameter values is in some row, constraints are kept, and the rows
are the same on every run (stable test ids). Runs on any machine."""
import itertools

import pytest

from covering import covering, pairwise, required_pairs, uncovered_pairs

INTS = ["int8", "uint8", "int32", "int64"]
FLOATS = ["float32", "float64", "float16", "bfloat16"]


def no_avg_on_ints(row):
    return not (row.get("op") == "AVG" and row.get("dtype") in INTS)


# test_cuda.py's largest matrix: n x dtype x op x size x algorithm x offset.
ALLREDUCE = {
    "n": [2, 3, 8],
    "dtype": FLOATS + INTS,
    "op": ["SUM", "AVG", "PRODUCT", "MIN", "MAX"],
    "size": [0, 1, 3, 7, 8, 15, 16, 17, 1000, 2**18 + 3],
    "algorithm": ["auto", "direct", "ring"],
    "offset": [0, 1],
}


@pytest.mark.parametrize("factors, valid", [
    (ALLREDUCE, no_avg_on_ints),
    ({"a": [1, 2], "b": [1, 2], "c": [1, 2]}, lambda r: True),
    ({"a": list(range(7)), "b": list(range(5)), "c": [0], "d": list(range(3))}, lambda r: True),
    ({"only": [1, 2, 3]}, lambda r: True),
])
def test_every_valid_pair_is_covered(factors, valid):
    rows = pairwise(factors, valid)
    assert not uncovered_pairs(rows, factors, valid)
    assert all(valid(r) for r in rows)
    assert all(set(r) == set(factors) for r in rows)


def test_the_covering_array_is_far_smaller_than_the_product():
    rows = pairwise(ALLREDUCE, no_avg_on_ints)
    full = sum(1 for vals in itertools.product(*ALLREDUCE.values())
               if no_avg_on_ints(dict(zip(ALLREDUCE, vals))))
    # the lower bound is the product of the two largest lists (10 sizes x 8 dtypes)
    assert 80 <= len(rows) <= 120, len(rows)
    assert full == 6480 and len(rows) < full / 50


def test_constraints_drop_impossible_pairs_and_rows():
    req = required_pairs(ALLREDUCE, no_avg_on_ints)
    assert (("dtype", FLOATS.index("float32")), ("op", 1)) in req
    assert (("dtype", len(FLOATS)), ("op", 1)) not in req  # (int8, AVG)
    assert not any(r["op"] == "AVG" and r["dtype"] in INTS for r in covering(ALLREDUCE, 200, 5, no_avg_on_ints))


def test_rows_are_deterministic_and_random_rows_are_seeded_and_distinct():
    assert pairwise(ALLREDUCE, no_avg_on_ints) == pairwise(ALLREDUCE, no_avg_on_ints)
    a = covering(ALLREDUCE, 50, seed=1, valid=no_avg_on_ints)
    assert a == covering(ALLREDUCE, 50, seed=1, valid=no_avg_on_ints)
    assert a != covering(ALLREDUCE, 50, seed=2, valid=no_avg_on_ints)
    keys = [tuple(r.values()) for r in a]
    assert len(keys) == len(set(keys))


def test_a_missing_pair_is_reported():
    factors = {"a": [1, 2], "b": [1, 2]}
    assert uncovered_pairs([{"a": 1, "b": 1}, {"a": 2, "b": 2}], factors) == {(("a", 0), ("b", 1)),
                                                                              (("a", 1), ("b", 0))}


def test_an_empty_factor_is_refused():
    with pytest.raises(ValueError, match="empty: \\['b'\\]"):
        pairwise({"a": [1], "b": []})
