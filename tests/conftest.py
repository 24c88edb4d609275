"""Shared pytest configuration: ``--update-golden`` and an isolated gradc cache."""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the expected files under tests/golden/ instead of "
                          "comparing against them")


# pytest-xdist (``-n 2 --dist loadgroup --no-loadscope-reorder``): the tests of one file
# run in one worker, so a module-scoped fixture (a compiled module, every kernel's PTX) is
# built once, not once per worker; the framework adapters' files share a worker, so the
# float64 examples and their derived second-order ops are compiled once for PyTorch and
# JAX together.  The groups are handed out longest first (and xdist keeps this order
# instead of sorting groups by their test count), so that the two workers end together
# on short files instead of one idling while the other runs a long one: _LONGEST, the
# groups that took longest alone (seconds of one file's run on one core, 2026-12-04
# after branch suite5's trims: adapters 279, primitives 166, PTX 152, reduce kernels
# 125, testgen 120, safe gradients ~100, docs 83, hostile arrays 80, kernel examples
# 51; test_bench where the earlier measure put it; split rows 68, 2026-12-05; the
# simulator's files, each in a process and a group of its own, 40, 35 and 28 s alone
# (session 33: 138 s together in one worker's process, 2026-12-05), gpu_check in the
# simulator 20), then the other files with ``slow`` tests, then the rest in their order.
_SHARED_WORKER = {"tests/adapters/": "adapters"}
_LONGEST = ("adapters", "tests/ir/test_primitives.py", "tests/cuda/test_ptx.py",
            "tests/codegen/test_reduce_kernels.py", "tests/tools/test_testgen.py",
            "tests/numerics/test_safe_gradients.py", "tests/test_docs.py",
            "tests/codegen/test_hostile_arrays.py", "tests/codegen/test_split_rows.py",
            "simulator test_sim_ops.py", "tests/test_kernel_examples.py",
            "simulator test_sim_split_rows.py", "simulator test_sim_rowwise_special.py",
            "tests/cuda/test_simulator.py", "tests/tools/test_bench.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    def group_of(item: pytest.Item) -> str:
        return item.get_closest_marker("xdist_group").args[0]

    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = next((g for prefix, g in _SHARED_WORKER.items()
                          if file_of(item).startswith(prefix)), file_of(item))
            item.add_marker(pytest.mark.xdist_group(group))
    slow = {group_of(i) for i in items if i.get_closest_marker("slow")}
    rank = {g: k for k, g in enumerate(_LONGEST)}
    # stable: a group's files, and the files of one rank, keep their order
    items.sort(key=lambda i: rank.get(group_of(i), len(rank) + (group_of(i) not in slow)))


# Nothing left behind: the run gets a temp folder of its own (TMPDIR, inherited by the
# xdist workers and every subprocess), and at the end everything in it must be gone but
# pytest's own tmp_path folders (``pytest-of-USER``) and the caches other libraries keep
# there by design (_THEIRS).  Anything else fails the run, naming what was left; then the
# folder is removed, so the real temp folder is left as the run found it.
_TEMP_ENV = "GRADC_TEST_TMPDIR"
_THEIRS = ("pytest-of-", "torchinductor_")
_RUN_CACHE = "gradc-cache-of-the-run"         # removed with the folder, not a leftover
_RUN_MODULES = "modules-of-the-run"           # import_module_text's files, likewise


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(_TEMP_ENV) or config.getoption("basetemp", None):
        return                                  # an xdist worker, or a chosen --basetemp
    import tempfile
    private = tempfile.mkdtemp(prefix="gradc-tests-")
    os.environ[_TEMP_ENV] = os.environ["TMPDIR"] = private
    tempfile.tempdir = None                     # re-read TMPDIR
    config.stash[_temp_key] = private
    # One gradc cache for the whole run (workers and their subprocesses inherit it): a
    # module compiled by one process, with Numba's compiled kernels beside it, is
    # imported by the others (the cache's writes are atomic, made for processes that
    # share it).  Tests that need a cache of their own set GRADC_CACHE_DIR themselves.
    os.environ.setdefault("GRADC_CACHE_DIR", os.path.join(private, _RUN_CACHE))


_temp_key = pytest.StashKey[str]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    private = session.config.stash.get(_temp_key, None)
    if private is None:
        return
    import shutil
    left = sorted(p for p in os.listdir(private)
                  if not p.startswith(_THEIRS) and p not in (_RUN_CACHE, _RUN_MODULES))
    shutil.rmtree(private, ignore_errors=True)
    if left:
        session.config.stash[_left_key] = left
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_left_key = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    left = config.stash.get(_left_key, [])
    if left:
        terminalreporter.section("files left in the temp folder", red=True)
        terminalreporter.line(f"FAILED: the tests left {len(left)} file(s) in the temp "
                              f"folder (write under tmp_path): " + ", ".join(left[:20]), red=True)


@pytest.fixture(scope="session")
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run should rewrite golden files (``pytest --update-golden``)."""
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session", autouse=True)
def _gradc_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """Modules compiled by ``gradc.load`` go to the run's cache (pytest_configure) or,
    in a run started otherwise (``--basetemp``), to a per-session directory; never to
    the user's cache (unless GRADC_CACHE_DIR is set explicitly)."""
    if os.environ.get("GRADC_CACHE_DIR"):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GRADC_CACHE_DIR", str(tmp_path_factory.mktemp("gradc-cache")))
        yield


# CI runs hypothesis derandomised (the same examples every run), so that a
# landing never depends on luck; locally it explores new examples each run.  Neither
# has hypothesis's timing checks (its deadline and the too_slow health check): timing
# never decides a test, and the machines are shared (a draw once took 10 s under load).
try:
    from hypothesis import HealthCheck, settings

    untimed = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("gradc", **untimed)
    settings.register_profile("ci", derandomize=True, database=None, **untimed)
    settings.load_profile("ci" if os.environ.get("CI") else "gradc")
except ImportError:          # hypothesis is in the test extra
    pass


# A worker ends the run holding about 5 million objects (the generated modules its tests
# imported, Numba's compiled kernels, their types and IR), and CPython's full collections
# walk every one: about 180 of them, 1.1-1.8 s each, were 320 s of a run's 2,100 s of CPU
# (2026-12-08, timed with gc.callbacks).  What a test file leaves behind stays for the rest
# of the run anyway (sys.modules, Numba's caches), so when each file starts, the garbage is
# collected and what is alive is frozen (gc.freeze): later collections skip it, and a full
# collection walks only what the files since have made.  In a file, a full collection
# waits for 100 collections of the middle generation instead of 10: what a file's
# compilations leave (Numba's IR) lives until the next file starts.  Together: 320 s of
# collections to 175 s with the freeze alone, 13.8 s to 7.5 s in two files of row kernels
# with the threshold too; the largest worker's resident set 8.6 GB against 8.0 GB.
gc.set_threshold(700, 10, 100)


@pytest.fixture(scope="module", autouse=True)
def _freeze_what_earlier_files_left():
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(scope="session")
def import_module_text(tmp_path_factory: pytest.TempPathFactory):
    """``import_module_text(text, name)``: write generated module text to a file and
    import it (a real file, so Numba's on-disk cache works as for users)."""
    import importlib.util

    shared = os.environ.get(_TEMP_ENV)

    def load(text: str, name: str):
        if shared is None:                      # a run with --basetemp: a folder each
            path = tmp_path_factory.mktemp(name) / f"{name}.py"
            path.write_text(text, encoding="utf-8")
        else:
            # One file per text for the whole run (workers too), written once: a text
            # another test (or worker) imported already finds Numba's compiled kernels
            # beside it instead of compiling them again.
            import hashlib
            import tempfile

            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:20]
            path = Path(shared, _RUN_MODULES, f"{name}_{digest}.py")
            if not path.exists():
                path.parent.mkdir(exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, path)
        # imported under its file's stem, and registered: Numba's cache, read by another
        # process, rebuilds a kernel's environment by importing its module's name (a
        # module missing from sys.modules is '<dynamic>' to it: ModuleNotFoundError)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch):
    """``kernel_calls(module, *suffixes)``: a list that grows by one at each call of a
    generated module's kernel (a global ``_g...``) whose name ends with one of
    ``suffixes`` (the wrappers call them as module globals)."""
    def count(module, *suffixes: str) -> list:
        calls: list = []
        for name in [n for n in dir(module) if n.startswith("_g") and n.endswith(suffixes)]:
            def counted(*args, _inner=getattr(module, name)):
                calls.append(1)
                return _inner(*args)
            monkeypatch.setattr(module, name, counted)
        return calls
    return count
