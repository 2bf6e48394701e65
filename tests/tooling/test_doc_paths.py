"""Every repository path a doc or a comment names exists.

Files move (csrc/core's folders did, more than once); a doc or a comment that
still names the old place sends the reader nowhere. This scans the docs
(README.md, docs/**.md) and the comments and docstrings of the code
(csrc/, fastpar/, scripts/, tests/, benchmarks/, examples/) for tokens that look
like repository paths or file names with a source or doc extension, and
resolves each against the checkout: a path from the root, from the file's own
folder, a path's tail (`cuda_p2p/handle_cache.h`), a bare file name anywhere
in the tree, or a glob (`*_slots.h`). What is not a repository file (outputs
the benchmarks write, torch's own files, system paths) is in ALLOWED."""
from __future__ import annotations

import ast
import fnmatch
import io
import os
import re
import subprocess
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXTS = "py|pyi|h|hpp|cuh|cu|cpp|cc|c|md|sh|toml|txt|cfg|ini|yml|yaml"
TOP = "csrc|fastpar|scripts|tests|benchmarks|examples|docs|\\.ci"
TOKEN = re.compile(
    rf"(?<![\w/.$~<>-])((?:\.\./|\./)?(?:{TOP})/[\w./*-]*[\w*/]|[\w*.-]+(?:/[\w*.-]+)*\.(?:{EXTS}))(?![\w/(<-])")

# Named on purpose, not repository files: what the benchmarks and scripts write,
# files of torch, CUDA and other projects, examples of user paths.
ALLOWED = {
    # outputs
    "bench_out", "train_main.csv", "collective_sweep.csv", "gpu_check.log", "build.log", "tests.log",
    "bench.log", "fastpar-build.log", "pip.log", "runs.csv", "table.md", "ds.csv",
    # torch's, CUDA's, other projects' files
    "__init__.py", "cpp_extension.py", "distributed_c10d.py", "ProcessGroupGloo.cpp", "ProcessGroupNCCL.cpp",
    "Backend.hpp", "ProcessGroup.hpp", "Work.hpp", "Types.hpp", "Store.hpp", "cuda_runtime.h", "cusparse.h",
    "cublas_v2.h", "cuda.h", "nccl.h", "setup.cfg", "entry_points.txt", "METADATA", "sitecustomize.py",
    "conftest.py", "child.py", "lightning_client.py", "cuda_fp16.h", "include/linux/sched.h",
    "test/distributed/test_distributed_spawn.py",  # torch's test suite (scripts/torch_dist_suite.py)
    "csrc/cpu/comm/shm.cpp",  # DeepSpeed's
    "fastpar/_build_info.py",  # what the build writes (setup.py)
}
# Tokens starting with these are not repository paths.
ALLOWED_PREFIXES = ("bench_out/", "benchmarks/results/readme/", "build/", ".venv/", "/", "...",
                    "fastpar/_C",  # the built extension
                    "fastpar/nccl/", "fastpar/cuda/")  # Store key prefixes
# This file names missing paths on purpose.
NOT_SCANNED = ("tests/tooling/test_doc_paths.py",)


def tracked() -> list:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [p for p in out if p and os.path.exists(os.path.join(ROOT, p))]


def comment_text(path: str, text: str) -> list:
    """(line number, text) of the comments and docstrings of a source file."""
    out = []
    if path.endswith(".py"):
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.COMMENT:
                    out.append((tok.start[0], tok.string))
        except (tokenize.TokenError, IndentationError):
            pass
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return out
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                body = getattr(node, "body", [])
                if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                                        ast.Constant) \
                        and isinstance(body[0].value.value, str):
                    for i, line in enumerate(body[0].value.value.split("\n")):
                        out.append((body[0].lineno + i, line))
        return out
    if path.endswith(".sh") or os.path.basename(path) in ("run", "CMakeLists.txt"):
        for i, line in enumerate(text.split("\n"), 1):
            if "#" in line:
                out.append((i, line[line.index("#"):]))
        return out
    # C++ / CUDA: // comments and /* */ blocks
    in_block = False
    for i, line in enumerate(text.split("\n"), 1):
        if in_block:
            out.append((i, line))
            if "*/" in line:
                in_block = False
            continue
        if "//" in line:
            out.append((i, line[line.index("//"):]))
            line = line[:line.index("//")]
        if "/*" in line:
            out.append((i, line[line.index("/*"):]))
            in_block = "*/" not in line[line.index("/*"):]
    return out


def sources(files: list) -> list:
    """(path, [(line, text)]) of every doc and every commented source to scan."""
    out = []
    for p in files:
        if p in NOT_SCANNED:
            continue
        full = os.path.join(ROOT, p)
        if p == "README.md" or (p.startswith("docs/") and p.endswith(".md")):
            with open(full, errors="replace") as f:
                out.append((p, list(enumerate(f.read().split("\n"), 1))))
        elif p.split("/")[0] in ("csrc", "fastpar", "scripts", "tests", "benchmarks", "examples", ".ci") \
                and re.search(r"\.(py|h|hpp|cuh|cu|cpp|cc|sh)$|^\.ci/run$", p):
            with open(full, errors="replace") as f:
                out.append((p, comment_text(p, f.read())))
        elif p == "CMakeLists.txt":
            with open(full) as f:
                out.append((p, comment_text(p, f.read())))
    return out


class Resolver:
    def __init__(self, files: list):
        self.files = files
        self.dirs = {os.path.dirname(p) for p in files}
        for d in list(self.dirs):
            while d:
                d = os.path.dirname(d)
                self.dirs.add(d)
        self.names = {os.path.basename(p) for p in files}

    def exists(self, token: str, where: str) -> bool:
        t = token.rstrip("/.")
        if not t or t in ALLOWED or os.path.basename(t) in ALLOWED or token.startswith(ALLOWED_PREFIXES):
            return True
        candidates = [os.path.normpath(t), os.path.normpath(os.path.join(os.path.dirname(where), t))]
        if any(c in self.dirs or c in self.files for c in candidates):
            return True
        if "*" in t:
            pattern = "*" + t if "/" in t else t
            return any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(os.path.basename(p), t) for p in self.files)
        if "/" not in t:
            return t in self.names or t in {os.path.basename(d) for d in self.dirs}
        # a path's tail (transport/cuda_p2p/handle_cache.h), or a folder's
        return any(p.endswith("/" + t) for p in self.files) or any(d.endswith("/" + t) for d in self.dirs)


def missing_paths() -> list:
    files = tracked()
    res = Resolver(files)
    bad = []
    for path, lines in sources(files):
        for lineno, text in lines:
            if "http://" in text or "https://" in text:
                text = re.sub(r"https?://\S+", "", text)
            for m in TOKEN.finditer(text):
                token = m.group(1)
                if "{" in token or "$" in token:
                    continue
                if not res.exists(token, path):
                    bad.append(f"{path}:{lineno}: {token}")
    return bad


def test_every_path_named_in_docs_and_comments_exists():
    bad = missing_paths()
    assert not bad, (f"{len(bad)} paths named in docs or comments do not exist (fix them, or add what is not "
                     f"a repository file to ALLOWED in {__file__}):\n" + "\n".join(bad))


def test_the_scan_finds_a_stale_path(tmp_path):
    """The check can fail: a name that is not in the tree is reported, one that is, is not."""
    res = Resolver(tracked())
    assert not res.exists("csrc/core/kernels/no_such_file.h", "docs/x.md")
    assert not res.exists("fused_one_shot_gone.cu", "docs/x.md")
    assert res.exists("scripts/setup.sh", "docs/x.md")
    assert res.exists("tests/tooling/test_doc_paths.py", "README.md")
    assert [m.group(1) for m in TOKEN.finditer("see csrc/core/a.h and run.sh, not torch.cuda or 1.5")] == \
        ["csrc/core/a.h", "run.sh"]
