"""The GPU benchmark's CPU side (benchmarks/bench_cuda.py, gpu_summary.py):
argument parsing, rows, the targets table, CSV and plots, on synthetic rows
(--dry-run), so scripts/gpu_check.sh's report works before a GPU ever runs it."""
import csv
import os

import pytest
from bench_import import benchmark_module
from ci_policy import under_ci

gs = benchmark_module("gpu_summary")
bench_cuda = benchmark_module("bench_cuda")

MiB = gs.MiB


def test_dry_run_writes_csv_summary_and_plots(tmp_path, capsys):
    rows = bench_cuda.main(["--dry-run", "--out", str(tmp_path), "--quick"])
    args = bench_cuda.parse_args(["--quick"])
    n_lists = len(args.ks) * len(args.dtypes) * len(args.algorithms) * len(args.sizes)
    assert sum(r["part"] == "lists" for r in rows) == n_lists
    with open(tmp_path / "bench_cuda.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    by_name = {line.split("  ")[0].strip(): line for line in summary}
    # synthetic: one launch 5.8 us, k=2 6.5 us = 1.12 launches, k=8 14 us = 2.4 launches
    assert " met" in by_name["list allreduce 4 KiB, k=2, host per call, in launches"]
    assert "MISSED" in by_name["list allreduce 4 KiB, k=8, host per call, in launches"]
    # synthetic: n ranks take (n - 1) times 2 ranks' time
    assert "MISSED" in by_name["3 ranks on one GPU at 1 MiB, time / 2 ranks'"]
    # synthetic: launch 6.9 us; direct 7 us host, dist 9 us - fake 2 us = 7 us: 1.01 launches each
    assert " met" in by_name["direct call 4 KiB, 2 ranks on one GPU, host per call, in launches"]
    assert " met" in by_name["dist.all_reduce 4 KiB minus torch's fake backend's, 2 ranks, host per call, in launches"]
    assert "not measured" in by_name["distinct GPUs, busbw / NCCL from 64 MiB (worst)"]
    assert "error: host: RuntimeError: synthetic failure" in summary
    assert "one-shot limit, 3 ranks on one GPU: measured 256 KiB, in force 512 KiB" in summary
    assert " met" in by_name["registered / plain all_reduce time from 1 MiB (worst)"]  # synthetic: faster
    assert "decided: FASTPAR_CUDA_IPC_TWO_SHOT: fused won" in "\n".join(summary)  # synthetic: faster
    out = capsys.readouterr().out
    assert "Targets and measured" in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # the plots are part of what gpu_check.sh returns: CI must check them
        if under_ci():
            pytest.fail("CI=true: matplotlib is missing, so the plots went unchecked (bash scripts/setup.sh "
                        "installs it)")
        return
    assert (tmp_path / "lists.png").stat().st_size > 1000
    assert (tmp_path / "collectives.png").stat().st_size > 1000


def test_targets_take_the_worst_row_and_pair_ring_with_direct():
    rows = []
    for size, d_t, r_t in ((MiB, 1e-4, 1.5e-4), (16 * MiB, 1e-3, 3e-3)):
        rows.append(gs.list_row(gs.ONE_GPU, 2, "float32", "direct", size, d_t, "torch", 2 * d_t, 0.95 * d_t))
        rows.append(gs.list_row(gs.ONE_GPU, 2, "float32", "ring", size, r_t, "torch", 2 * d_t, 0.95 * d_t))
    lines = {t["target"]: t for t in gs.targets(rows)}
    ring = lines["list ring / direct GB/s from 1 MiB, one GPU (worst)"]
    assert ring["measured"] == pytest.approx(1 / 3) and ring["status"] == "MISSED"
    assert lines["list direct / copy from 16 MiB (worst)"]["measured"] == pytest.approx(0.95)
    assert lines["list direct / copy from 16 MiB (worst)"]["status"] == "met"
    assert lines["list allreduce 4 KiB, k=2, host per call, in launches"]["measured"] == "not measured"


def test_gpu_targets_are_in_launches_and_copies_of_the_same_run():
    """A launch and a copy's rate measured in the 2-rank run's own process
    are the units: 4 KiB host time over a launch (torch's share, its fake
    backend's time, taken off dist.all_reduce's), the 2kN bytes of HBM
    traffic of a registered all_reduce at the copy's rate over its time."""
    one = "shared cuda:0"
    rows = [gs.ref_row("launch_us", one, 2, 10.0), gs.ref_row("copy_GBps", one, 2, 4000.0),
            gs.ipc_row("fastpar", one, 2, 4 * 1024, 20e-6, 22e-6),
            gs.ipc_row("torch fake backend", one, 2, 4 * 1024, None, 10e-6),
            gs.ipc_row("fastpar direct", one, 2, 4 * 1024, 20e-6, 11e-6),
            gs.ipc_row("fastpar graph", one, 2, 4 * 1024, 7e-6, 6e-6),
            gs.ipc_row("fastpar", one, 2, 256 * 1024, 20e-6), gs.ipc_row("fastpar", one, 2, MiB, 40e-6),
            gs.ipc_row("fastpar", one, 2, 32 * MiB, 100e-6), gs.ipc_row("fastpar registered", one, 2, 32 * MiB, 50e-6),
            gs.ipc_row("fastpar registered steps", one, 2, 32 * MiB, 80e-6),
            gs.ipc_row("fastpar", one, 3, MiB, 1.0), gs.ipc_row("fastpar", one, 3, 32 * MiB, 150e-6)]
    lines = {t["target"]: t for t in gs.targets(rows)}
    over = lines["dist.all_reduce 4 KiB minus torch's fake backend's, 2 ranks, host per call, in launches"]
    assert over["measured"] == pytest.approx(1.2) and over["status"] == "MISSED"
    direct = lines["direct call 4 KiB, 2 ranks on one GPU, host per call, in launches"]
    assert direct["measured"] == pytest.approx(1.1) and direct["status"] == "MISSED"
    graph = lines["graph replay 4 KiB, 2 ranks on one GPU, host per replay, in launches"]
    assert graph["measured"] == pytest.approx(0.6) and graph["status"] == "met"
    assert lines["2 ranks on one GPU, 1 MiB time / 256 KiB time"]["measured"] == pytest.approx(2.0)
    reg = lines["registered, 2 ranks on one GPU, from 8 MiB, of the 2kN ceiling (4N) (worst)"]
    assert reg["measured"] == pytest.approx(4 * 32 * MiB / 4000e9 / 50e-6)
    push = lines["fused two-shot and registered push / step by step time, same run (worst)"]
    assert push["measured"] == pytest.approx(50 / 80) and push["status"] == "met"
    three = lines["3 ranks on one GPU at 1 MiB, time / 2 ranks'"]
    assert three["measured"] == pytest.approx(1.0 / 40e-6) and three["status"] == "MISSED"  # the 1 s call
    assert lines["4 ranks on one GPU at 1 MiB, time / 2 ranks'"]["measured"] == "not measured"


def test_fused_two_shot_targets_use_the_k_rank_floor_and_the_same_runs_steps():
    """k ranks' plain all_reduce against (5k-2)N bytes at the copy rate of
    the k-rank run; the fused two-shot against the step-by-step one of the
    same size, ranks and placement."""
    one = "shared cuda:0"
    rows = [gs.ref_row("copy_GBps", one, 3, 3000.0), gs.ref_row("copy_GBps", one, 4, 2000.0),
            gs.ipc_row("fastpar", one, 3, 32 * MiB, 200e-6), gs.ipc_row("fastpar", one, 4, 32 * MiB, 400e-6),
            gs.ipc_row("fastpar", one, 4, MiB, 30e-6),
            gs.ipc_row("fastpar two-shot steps", one, 3, 32 * MiB, 400e-6),
            gs.ipc_row("fastpar two-shot steps", one, 4, 32 * MiB, 500e-6)]
    lines = {t["target"]: t for t in gs.targets(rows)}
    ceiling = lines["2, 3, 4 ranks on one GPU, plain, from 8 MiB, of the (5k-2)N ceiling at the copy's rate (worst)"]
    # the worst of 3 ranks' 13N and 4 ranks' 18N (the 1 MiB row is below 8 MiB; no 2-rank rows)
    assert ceiling["measured"] == pytest.approx(min(13 * 32 * MiB / 3000e9 / 200e-6, 18 * 32 * MiB / 2000e9 / 400e-6))
    fused = lines["fused two-shot and registered push / step by step time, same run (worst)"]
    assert fused["measured"] == pytest.approx(0.8) and fused["status"] == "met"


def test_one_shot_limit_is_read_off_both_schedules_of_the_same_run():
    """Up to the limit in force the plain rows are one-shot and the forced
    rows two-shot, above it the other way round; the measured limit is the
    largest size up to which one-shot was never slower."""
    one = "shared cuda:0"
    rows = [gs.ref_row("one_shot_max_bytes", one, 3, 512 * 1024),
            gs.ipc_row("fastpar", one, 3, 256 * 1024, 10e-6), gs.ipc_row("fastpar two-shot forced", one, 3, 256 * 1024, 12e-6),
            gs.ipc_row("fastpar", one, 3, 512 * 1024, 15e-6), gs.ipc_row("fastpar two-shot forced", one, 3, 512 * 1024, 16e-6),
            gs.ipc_row("fastpar", one, 3, MiB, 20e-6), gs.ipc_row("fastpar one-shot forced", one, 3, MiB, 19e-6),
            gs.ipc_row("fastpar", one, 3, 2 * MiB, 30e-6), gs.ipc_row("fastpar one-shot forced", one, 3, 2 * MiB, 45e-6)]
    choice = gs.one_shot_choice(rows)
    assert [c["one/two"] for c in choice] == pytest.approx([10 / 12, 15 / 16, 19 / 20, 45 / 30])
    assert {c["limit measured"] for c in choice} == {"1 MiB"}
    assert {c["limit in force"] for c in choice} == {"512 KiB"}


def _pair(rows, new, old, ranks, size, t_new, t_old):
    one = "shared cuda:0"
    rows += [gs.ipc_row(new, one, ranks, size, t_new), gs.ipc_row(old, one, ranks, size, t_old)]


def test_decisions_name_the_form_that_won_each_choice_in_the_same_run(tmp_path):
    """A new form wins where it is faster at the median size and at most
    ADOPT_WORST slower at any; a choice the run did not compare gets no line;
    report() writes the lines into summary.txt."""
    rows = []
    # fused two-shot: faster at 2 of 3 sizes, 3% slower at one (noise): won;
    # the registered push, the same knob, faster
    _pair(rows, "fastpar", "fastpar two-shot steps", 2, 8 * MiB, 40e-6, 80e-6)
    _pair(rows, "fastpar", "fastpar two-shot steps", 2, 32 * MiB, 100e-6, 150e-6)
    _pair(rows, "fastpar", "fastpar two-shot steps", 3, 8 * MiB, 103e-6, 100e-6)
    _pair(rows, "fastpar registered", "fastpar registered steps", 2, 32 * MiB, 60e-6, 90e-6)
    lines = gs.decisions(rows)
    assert len(lines) == 1, lines
    assert lines[0].startswith("FASTPAR_CUDA_IPC_TWO_SHOT: fused won (fused / steps time: median 0.667, worst 1.03, "
                               "4 sizes); the steps form can go"), lines
    # fused collectives: one 20% slower: steps stays
    _pair(rows, "fastpar broadcast fused", "fastpar broadcast steps", 2, MiB, 10e-6, 20e-6)
    _pair(rows, "fastpar all_gather fused", "fastpar all_gather steps", 2, MiB, 24e-6, 20e-6)
    lines = gs.decisions(rows)
    assert lines[1].startswith("FASTPAR_CUDA_IPC_COLLECTIVES: steps won"), lines
    assert lines[1].endswith("the fused form can go"), lines
    # the block barriers' flags (the test hook's FASTPAR_CUDA_IPC_FLAGS), eager
    # and graphed: the waiter's memory slower at the median: the peer's stays
    _pair(rows, "fastpar flags waiter", "fastpar flags peer", 2, 4 * 1024, 9e-6, 10e-6)
    _pair(rows, "fastpar flags waiter", "fastpar flags peer", 2, 8 * MiB, 60e-6, 50e-6)
    _pair(rows, "fastpar graph flags waiter", "fastpar graph flags peer", 2, 4 * 1024, 8e-6, 7e-6)
    lines = gs.decisions(rows)
    assert lines[2].startswith("FASTPAR_CUDA_IPC_FLAGS: peer won (waiter / peer time: median 1.14"), lines
    assert lines[2].endswith("the waiter form can go"), lines
    gs.report(rows, str(tmp_path))
    summary = (tmp_path / "summary.txt").read_text()
    assert "decided: FASTPAR_CUDA_IPC_TWO_SHOT: fused won" in summary, summary
    assert gs.decisions([]) == []


def test_dry_run_has_both_two_shot_forms(tmp_path):
    rows = bench_cuda.main(["--dry-run", "--quick", "--out", str(tmp_path)])
    backends = {r["backend"] for r in rows if r["part"] == "ipc"}
    assert {"fastpar", "fastpar two-shot steps"} <= backends


def test_ranks_are_a_list_of_counts():
    assert bench_cuda.parse_args([]).ranks == [2, 3, 4]
    assert bench_cuda.parse_args(["--ranks", "2"]).ranks == [2]
    with pytest.raises(SystemExit):
        bench_cuda.parse_args(["--ranks", "2,9"])


def test_rows_count_bytes_as_the_readme_does():
    r = gs.list_row(gs.ONE_GPU, 4, "bfloat16", "direct", MiB, 1e-5, "torch", 2e-5, 5e-6)
    assert r["fastpar_GBps"] == pytest.approx(2 * 4 * MiB / 1e-5 / 1e9)
    assert r["vs_baseline"] == pytest.approx(2.0) and r["of_copy"] == pytest.approx(0.5)
    ipc = gs.ipc_row("fastpar", "shared cuda:0", 4, 32 * MiB, 1e-4)
    assert ipc["busbw_GBps"] == pytest.approx(ipc["algbw_GBps"] * 1.5)


def test_bad_part_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        bench_cuda.parse_args(["--part", "lists,nccl"])
    assert "--part 'nccl' is not one of check, lists, host, ipc" in capsys.readouterr().err


def test_report_only_merges_rows_of_earlier_parts(tmp_path):
    """gpu_check.sh measures the parts in separate runs (MPS on only for the
    multi-process one) and reports them together with --report-only."""
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    rows_a = bench_cuda.main(["--dry-run", "--quick", "--out", str(tmp_path / "a"), "--rows-out", str(first)])
    rows_b = bench_cuda.main(["--dry-run", "--quick", "--ks", "4", "--out", str(tmp_path / "b"),
                              "--rows-out", str(second)])
    merged = bench_cuda.main(["--report-only", "--rows-in", f"{first},{second}", "--out", str(tmp_path / "all")])
    assert len(merged) == len(rows_a) + len(rows_b)
    with open(tmp_path / "all" / "bench_cuda.csv") as f:
        assert sum(1 for r in csv.DictReader(f) if r["part"] == "lists" and r["k"] == "4") == \
            sum(1 for r in rows_b if r["part"] == "lists")


GPU_CHECK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         "scripts", "gpu_check.sh")


def test_gpu_check_script_parses():
    import subprocess

    r = subprocess.run(["bash", "-n", GPU_CHECK], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_check_stops_at_once_without_a_gpu(tmp_path):
    """nvidia-smi finding no GPU (a stand-in that fails, first on the PATH):
    the script says so and exits 1 before building anything."""
    import subprocess

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", GPU_CHECK_BUDGET_S="540")
    env.pop("GPU_CHECK_PHASES", None)
    r = subprocess.run(["bash", GPU_CHECK, "--out", str(tmp_path / "results")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gpu_check: no NVIDIA GPU here (nvidia-smi finds none)" in r.stdout
    assert "== build" not in r.stdout


def test_gpu_check_refuses_a_budget_that_would_starve_the_build(tmp_path):
    """GPU_CHECK_BUDGET_S=170 once gave the build 10 s: now refused up front
    (exit 2, before nvidia-smi or the build), naming the minimum and its parts."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env.update(GPU_CHECK_BUDGET_S="170", GPU_CHECK_BUILD_S="120")
    r = subprocess.run(["bash", GPU_CHECK, "--out", str(tmp_path / "results")], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert ("gpu_check: the budget of 170 s is below the minimum of 510 s for the selected phases (build 120 s, "
            "smoke test and MPS 30 s, single 60 s, lists 50 s, multi 140 s, ipc 110 s)") in r.stdout
    assert "== build" not in r.stdout and "nvidia-smi" not in r.stdout


def test_gpu_check_options_set_the_results_folder_and_the_budget(tmp_path):
    """--out DIR: the log (and every result) goes there, a relative DIR from
    where the script started; --budget overrides GPU_CHECK_BUDGET_S."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    env.update(GPU_CHECK_BUDGET_S="540", GPU_CHECK_BUILD_S="120")
    r = subprocess.run(["bash", GPU_CHECK, "--budget", "200", "--out", "res"], capture_output=True, text=True,
                       env=env, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "the budget of 200 s is below the minimum of 510 s" in r.stdout
    assert "the budget of 200 s" in (tmp_path / "res" / "gpu_check.log").read_text()
    r = subprocess.run(["bash", GPU_CHECK, "--frobnicate"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "unknown argument '--frobnicate'" in r.stdout, r.stdout + r.stderr
    r = subprocess.run(["bash", GPU_CHECK, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and "--out DIR --budget SECONDS" in r.stdout, r.stdout + r.stderr


def _phases(script: str, env: dict, clock_stopped: bool = False) -> list:
    """What `script` prints after sourcing gpu_check_phases.sh with a budget
    of 540 s; clock_stopped: no time passes (left() is the whole budget), so
    that the arithmetic is checked without a second ticking by on a busy machine."""
    import subprocess

    lib = os.path.join(os.path.dirname(GPU_CHECK), "gpu_check_phases.sh")
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    stop = "left() { echo $BUDGET; }; " if clock_stopped else ""
    r = subprocess.run(["bash", "-c", f"BUDGET=540; START=$SECONDS; source {lib}; {stop}{script}"], capture_output=True,
                       text=True, env=dict(base, GPU_CHECK_BUILD_S="120", **env), timeout=30,
                       cwd=os.path.dirname(os.path.dirname(GPU_CHECK)))
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_gpu_check_default_budget_keeps_time_for_later_phases():
    """The default budget (540 s, from the start) holds the build's need and
    every phase's (single 60, lists 50, multi 140, ipc 110); the build may take
    what the phases' needs leave; each phase keeps the needs of those after it."""
    got = _phases("for p in single lists multi ipc; do want $p && echo $p; done; min_budget; build_limit; "
                  "reserve_after build; reserve_after single; reserve_after lists; reserve_after multi; "
                  "reserve_after ipc; phase_limit 150 280; phase_limit 900 0; phase_limit 150 535", {},
                  clock_stopped=True)
    assert got == ["single", "lists", "multi", "ipc", "510", "150", "390", "300", "250", "110", "0", "150", "540",
                   "10"], got


def test_gpu_check_phase_selection_gives_the_last_phase_the_rest_of_the_budget():
    """GPU_CHECK_PHASES=multi: only that phase, and nothing kept after it;
    single,multi: single keeps multi's need; the last phase gets the rest."""
    got = _phases("for p in single lists multi ipc; do want $p && echo $p; done; reserve_after multi; min_budget",
                  {"GPU_CHECK_PHASES": "multi"})
    assert got == ["multi", "0", "290"], got
    got = _phases("reserve_after single; reserve_after multi", {"GPU_CHECK_PHASES": "single,multi"})
    assert got == ["140", "0"], got
    got = _phases("reserve_after single", {"GPU_CHECK_PHASES": "single"})
    assert got == ["0"], got
    got = _phases("phase_cap lists; reserve_after lists; phase_cap multi", {"GPU_CHECK_PHASES": "lists,multi"})
    assert got == ["50", "140", "540"], got
    got = _phases("phase_cap lists", {"GPU_CHECK_PHASES": "single,lists"})
    assert got == ["540"], got


def test_gpu_check_budget_refusal_names_the_minimum():
    got = _phases("check_budget; echo rc=$?", {"GPU_CHECK_PHASES": "multi"})
    assert got[-1] == "rc=0", got
    r = _phases("BUDGET=200; check_budget; echo rc=$?", {"GPU_CHECK_PHASES": "multi"})
    assert r[-1] == "rc=1" and "minimum of 290 s" in " ".join(r), r
