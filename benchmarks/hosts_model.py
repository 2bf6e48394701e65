"""The cost model of fastpar's all_reduce across hosts (bench_hosts.py's rows;
the assumptions are in docs/hosts.md, "Cost model").

Rows are dicts with rate, layout, hosts (H), ranks_per_host (R), bytes (S),
impl and seconds; impl "intra" and "inter" are the two levels timed alone,
"fastpar" the all_reduce the model predicts.

Levels, fitted on the levels timed alone:
  intra(S, R) = a_s + (b0 + b1 R) S                 shared memory in each host
  inter(S, H) = 2 (H-1) a_l + B(S, H) (b_l + M k_l)  gloo's ring among the leaders
  with B(S, H) = 2 (H-1)/H S, the bytes each leader sends, a_l, b_l, k_l per
  rate, and M the hosts whose leaders share one machine's cores (here all H:
  the hosts are namespaces of one machine). k_l is the CPU time per byte of
  each leader's TCP: where the cores, not the link, bound it, every leader
  more on the same cores makes each byte slower (b_l is then about 0); where
  the link binds, k_l is about 0. Predictions for hosts with cores of their
  own take M = 1.

Composition, fitted on fastpar's own points (both rates at once):
  one piece (S < 2 MiB):  a_c + intra(S) + inter(S)
  p = min(8, S / 1 MiB) pieces of s = S/p, pipelined:
      a_c + intra(s) + inter(s) + (p-1) max(inter(s), intra(s) + c B(s))
  a_c: what a call costs beyond its two levels (the hand-offs between them);
  c: seconds of CPU per byte a leader sends that the shared-memory steps of the
  next piece wait for, because the leaders' TCP and the host's copies run on
  the same cores. c = 0 is a pipeline whose levels overlap perfectly (the link,
  not the CPU, bounds the leaders' step); c B(s) about inter(s), one whose
  leaders' step is all CPU, so that the levels add up. c is one constant for
  every rate: what differs between rates is only whether the link (inter) or
  the CPU (intra + c B) is the longer.
"""
from __future__ import annotations

import numpy as np

MIN_PIECE, MAX_PIECES = 1 << 20, 8  # hierarchical_engine.cpp's pieces


def _lstsq_rel(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of the relative error: each point counts the same whatever its size."""
    w = 1 / y
    return np.linalg.lstsq(A * w[:, None], y * w, rcond=None)[0]


def fit_levels(rows: list[dict]) -> dict:
    model = {}
    intra = [r for r in rows if r["impl"] == "intra"]
    A = np.array([[1.0, r["bytes"], r["bytes"] * r["ranks_per_host"]] for r in intra])
    a_s, b0, b1 = _lstsq_rel(A, np.array([r["seconds"] for r in intra]))
    model["intra"] = {"alpha_s": a_s, "beta0_s_per_byte": b0, "beta1_s_per_byte_per_rank": b1}
    for rate in sorted({r["rate"] for r in rows}):
        inter = [r for r in rows if r["impl"] == "inter" and r["rate"] == rate]
        A = np.array([[2 * (r["hosts"] - 1), sent(r["bytes"], r["hosts"]), sent(r["bytes"], r["hosts"]) * r["hosts"]]
                      for r in inter])
        if len({r["hosts"] for r in inter}) < 2:  # k_l needs two host counts; with one it is part of b_l
            A = A[:, :2]
        fitted = _lstsq_rel(A, np.array([r["seconds"] for r in inter]))
        model[f"inter_{rate}"] = {"alpha_s": fitted[0], "beta_s_per_byte": fitted[1],
                                  "cpu_s_per_byte_per_sharing_host": fitted[2] if len(fitted) > 2 else 0.0}
    return model


def sent(S: float, H: int) -> float:
    """B(S, H): the bytes each leader sends (and receives) in a ring all_reduce of S bytes."""
    return 2 * (H - 1) / H * S


def intra(model: dict, s: float, R: int) -> float:
    i = model["intra"]
    return max(0.0, i["alpha_s"] + (i["beta0_s_per_byte"] + i["beta1_s_per_byte_per_rank"] * R) * s)


def inter(model: dict, s: float, H: int, rate: str, sharing: int | None = None) -> float:
    """sharing: M, the hosts whose leaders share the cores (None: all H, as measured)."""
    lk = model[f"inter_{rate}"]
    M = H if sharing is None else sharing
    return max(0.0, 2 * (H - 1) * lk["alpha_s"]
               + sent(s, H) * (lk["beta_s_per_byte"] + M * lk["cpu_s_per_byte_per_sharing_host"]))


def predict(model: dict, S: float, H: int, R: int, rate: str, composition: bool = True,
            sharing: int | None = None) -> float:
    """fastpar's all_reduce of S bytes over H hosts of R ranks. composition=False:
    the levels only (a_c = c = 0); sharing: as for inter()."""
    comp = model.get("composition", {}) if composition else {}
    a_c, c = comp.get("alpha_call_s", 0.0), comp.get("cpu_s_per_sent_byte", 0.0)
    p = min(MAX_PIECES, int(S // MIN_PIECE))
    if p < 2:
        return a_c + intra(model, S, R) + inter(model, S, H, rate, sharing)
    s = S / p
    i, lk = intra(model, s, R), inter(model, s, H, rate, sharing)
    return a_c + i + lk + (p - 1) * max(lk, i + c * sent(s, H))


def fit_composition(model: dict, fastpar: list[dict]) -> dict:
    """a_c and c by least squares of the relative error over `fastpar` rows:
    for each c on a grid a_c has a closed form; the best pair is kept (a grid
    from 0 to 4 times the largest per-byte time of 2 leaders' ring, then a
    finer one around the best)."""
    y = np.array([r["seconds"] for r in fastpar])
    b_ls = [v["beta_s_per_byte"] + 2 * v["cpu_s_per_byte_per_sharing_host"]  # per byte of 2 leaders' ring
            for k, v in model.items() if k.startswith("inter_")]

    def best_on(grid):
        best = None
        for c in grid:
            trial = {**model, "composition": {"alpha_call_s": 0.0, "cpu_s_per_sent_byte": c}}
            m = np.array([predict(trial, r["bytes"], r["hosts"], r["ranks_per_host"], r["rate"]) for r in fastpar])
            a = max(0.0, float(np.sum((1 - m / y) / y) / np.sum(1 / y ** 2)))  # argmin of sum(((a + m) / y - 1)^2)
            sse = float(np.sum(((a + m) / y - 1) ** 2))
            if best is None or sse < best[0]:
                best = (sse, a, float(c))
        return best

    top = 4 * max(max(b_ls), 0.0)
    step = top / 200
    coarse = best_on(np.linspace(0.0, top, 201))
    _, a_c, c = best_on(np.linspace(max(0.0, coarse[2] - step), coarse[2] + step, 101))
    return {"alpha_call_s": a_c, "cpu_s_per_sent_byte": c}


def fit(rows: list[dict]) -> dict:
    model = fit_levels(rows)
    model["composition"] = fit_composition(model, [r for r in rows if r["impl"] == "fastpar"])
    return model


def errors(rows: list[dict], model: dict, fit_rows: list[dict] | None = None) -> list[dict]:
    """Per fastpar point of `rows`: the model's relative error, with the
    levels only, and held out (a_c and c fitted without that layout's points
    at either rate; the levels keep every level row, which the target never
    is). `fit_rows`: the rows `model` was fitted on, when not `rows`."""
    fastpar = [r for r in rows if r["impl"] == "fastpar"]
    fitted = [r for r in (fit_rows if fit_rows is not None else rows) if r["impl"] == "fastpar"]
    held = {}
    for layout in sorted({r["layout"] for r in fastpar}):
        others = [r for r in fitted if r["layout"] != layout]
        held[layout] = {**model, "composition": fit_composition(model, others)} if others else None
    out = []
    for r in fastpar:
        args = (r["bytes"], r["hosts"], r["ranks_per_host"], r["rate"])
        m_held = held[r["layout"]]
        out.append({"rate": r["rate"], "layout": r["layout"], "bytes": r["bytes"], "seconds": r["seconds"],
                    "model_s": predict(model, *args),
                    "error": predict(model, *args) / r["seconds"] - 1,
                    "error_levels_only": predict(model, *args, composition=False) / r["seconds"] - 1,
                    "error_held_out": predict(m_held, *args) / r["seconds"] - 1 if m_held else None})
    return out
