"""Covering arrays for test matrices: instead of the full product of a test's
parameters (test_cuda.py's was 20,557 cases, 9-10 minutes on one GPU), a set
of rows in which every PAIR of values of any two parameters appears at least
once, plus seeded random rows. A bug that needs one parameter value, or a
combination of two, is still hit; the count grows with the product of the two
largest value lists rather than with the product of all of them.

Deterministic: the same parameters give the same rows in the same order on
every machine and every run, so test ids are stable (a failure can be rerun
by its id, a GPU check can select by -k).

    rows = pairwise({"n": [2, 3, 8], "dtype": DTYPES, "op": OPS}, valid=ok)

`valid(row)` is called on partial rows (a dict holding only the parameters
chosen so far) and must answer False only when the values present already
rule the row out (e.g. AVG with an integer dtype); pairs that no valid row can
hold are not required.
"""
from __future__ import annotations

import itertools
import random
from typing import Callable, Dict, List, Sequence


def _always(_row: dict) -> bool:
    return True


def required_pairs(factors: Dict[str, Sequence], valid: Callable[[dict], bool] = _always) -> set:
    """Every ((name_a, index_a), (name_b, index_b)) pair a covering array must hold."""
    names = list(factors)
    pairs = set()
    for a, b in itertools.combinations(range(len(names)), 2):
        na, nb = names[a], names[b]
        for i, va in enumerate(factors[na]):
            for j, vb in enumerate(factors[nb]):
                if valid({na: va, nb: vb}):
                    pairs.add(((na, i), (nb, j)))
    return pairs


def _pairs_of(row_idx: Dict[str, int], names: List[str]) -> set:
    out = set()
    for a, b in itertools.combinations(range(len(names)), 2):
        na, nb = names[a], names[b]
        if na in row_idx and nb in row_idx:
            out.add(((na, row_idx[na]), (nb, row_idx[nb])))
    return out


def pairwise(factors: Dict[str, Sequence], valid: Callable[[dict], bool] = _always) -> List[dict]:
    """Rows (dicts name -> value) covering every valid pair of values.

    Greedy, in the manner of AETG but without randomness: each row starts from
    the first pair not yet covered (in a fixed order) and fills the other
    parameters, one at a time in declaration order, with the value that covers
    the most uncovered pairs with the values already chosen (ties: the first
    value). Every row covers at least one new pair, so it ends."""
    names = list(factors)
    if any(len(factors[n]) == 0 for n in names):
        raise ValueError(f"every factor needs at least one value; empty: {[n for n in names if not factors[n]]}")
    values = {n: list(factors[n]) for n in names}

    def row_of(idx: Dict[str, int]) -> dict:
        return {n: values[n][i] for n, i in idx.items()}

    uncovered = required_pairs(factors, valid)
    order = sorted(uncovered, key=lambda p: (names.index(p[0][0]), p[0][1], names.index(p[1][0]), p[1][1]))
    rows: List[dict] = []
    if len(names) == 1:
        return [{names[0]: v} for v in values[names[0]] if valid({names[0]: v})]
    while uncovered:
        seed_pair = next(p for p in order if p in uncovered)
        idx = {seed_pair[0][0]: seed_pair[0][1], seed_pair[1][0]: seed_pair[1][1]}
        for n in names:
            if n in idx:
                continue
            best, best_gain = None, -1
            for i in range(len(values[n])):
                trial = dict(idx, **{n: i})
                if not valid(row_of(trial)):
                    continue
                gain = len(_pairs_of(trial, names) & uncovered)
                if gain > best_gain:
                    best, best_gain = i, gain
            if best is None:
                raise ValueError(f"no value of {n!r} completes a valid row from {row_of(idx)}")
            idx[n] = best
        new = _pairs_of(idx, names) & uncovered
        assert new, "a row that covers nothing new: the generator would not end"
        uncovered -= new
        rows.append({n: values[n][idx[n]] for n in names})
    return rows


def random_rows(factors: Dict[str, Sequence], count: int, seed: int,
                valid: Callable[[dict], bool] = _always) -> List[dict]:
    """`count` valid rows drawn with a seeded generator (the same rows on every
    run): combinations beyond pairs that the covering array would never try."""
    rng = random.Random(seed)
    names = list(factors)
    out: List[dict] = []
    tries = 0
    while len(out) < count:
        tries += 1
        if tries > 1000 * max(count, 1):
            raise ValueError("valid() refuses nearly every random row")
        row = {n: rng.choice(list(factors[n])) for n in names}
        if valid(row):
            out.append(row)
    return out


def covering(factors: Dict[str, Sequence], random_count: int = 0, seed: int = 0,
             valid: Callable[[dict], bool] = _always) -> List[dict]:
    """pairwise() rows, then `random_count` seeded random rows not already in
    it (duplicates dropped, so a test id is never repeated)."""
    rows = pairwise(factors, valid)
    seen = {tuple(_key(r[n]) for n in factors) for r in rows}
    for r in random_rows(factors, random_count, seed, valid):
        k = tuple(_key(r[n]) for n in factors)
        if k not in seen:
            seen.add(k)
            rows.append(r)
    return rows


def _key(v):
    return repr(v)


def uncovered_pairs(rows: List[dict], factors: Dict[str, Sequence],
                    valid: Callable[[dict], bool] = _always) -> set:
    """The required pairs that `rows` miss (empty for a covering array)."""
    names = list(factors)
    index = {n: {_key(v): i for i, v in enumerate(factors[n])} for n in names}
    seen = set()
    for r in rows:
        seen |= _pairs_of({n: index[n][_key(r[n])] for n in names}, names)
    return required_pairs(factors, valid) - seen
