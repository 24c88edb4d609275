"""The opt-in import hook: ``import NAME`` of ``NAME.grad`` on ``sys.path``."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

import gradc
from gradc.loader.disk_cache import entries
from gradc.loader.import_hook import GradFinder, GradLoader

NAMES = ("hook_ops", "hook_pkg", "hook_pkg.inner_ops", "hook_ns", "hook_ns.ns_ops",
         "hook_bad", "hook_shadow", "hook_main")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on sys.path, a fresh cache, and no hook or test module left behind."""
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "cache"))
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    yield root
    gradc.uninstall_import_hook()
    for name in NAMES:
        sys.modules.pop(name, None)


def test_import_finds_a_grad_file_on_sys_path(site) -> None:
    (site / "hook_ops.grad").write_text("op triple(x) -> y { y = 3 * x }\n")
    with pytest.raises(ModuleNotFoundError):
        import hook_ops  # noqa: F401
    finder = gradc.install_import_hook()
    import hook_ops
    assert sys.modules["hook_ops"] is hook_ops and hook_ops.__name__ == "hook_ops"
    assert hook_ops.__file__ == str((site / "hook_ops.grad").resolve())
    assert isinstance(hook_ops.__spec__.loader, GradLoader) and finder in sys.meta_path
    np.testing.assert_array_equal(hook_ops.triple(np.arange(3.0)), [0.0, 3.0, 6.0])
    assert [e.meta["source"] for e in entries()] == [hook_ops.__file__]   # gradc.load's cache
    assert gradc.uninstall_import_hook() and finder not in sys.meta_path
    assert not gradc.uninstall_import_hook()


def test_packages_regular_and_namespace(site) -> None:
    (site / "hook_pkg").mkdir()
    (site / "hook_pkg" / "__init__.py").write_text("")
    (site / "hook_pkg" / "inner_ops.grad").write_text("op neg(x) -> y { y = -x }\n")
    (site / "hook_ns").mkdir()                       # no __init__.py: a namespace package
    (site / "hook_ns" / "ns_ops.grad").write_text("op half(x) -> y { y = x / 2 }\n")
    with gradc.install_import_hook():
        import hook_ns.ns_ops
        import hook_pkg.inner_ops
        from hook_pkg import inner_ops
    assert not any(isinstance(f, GradFinder) for f in sys.meta_path)   # the with block ended
    assert inner_ops is hook_pkg.inner_ops is sys.modules["hook_pkg.inner_ops"]
    assert inner_ops.OPS["neg"].spec == "op neg(x) -> y { y = -x }"
    assert hook_ns.ns_ops.OPS["half"].signature == "(x) -> y"


def test_a_python_module_of_the_same_name_takes_precedence(site) -> None:
    (site / "hook_shadow.grad").write_text("op f(x) -> y { y = x }\n")
    (site / "hook_shadow.py").write_text("KIND = 'python'\n")
    gradc.install_import_hook()
    import hook_shadow
    assert hook_shadow.KIND == "python" and not entries()


def test_reload_compiles_a_changed_file_and_its_imports(site) -> None:
    (site / "lib.grad").write_text("op g(x) -> y { y = x + 1 }\n")
    main = site / "hook_main.grad"
    main.write_text('import "lib.grad"\nop f(x) -> y { y = 2 * g(x) }\n')
    gradc.install_import_hook()
    import hook_main
    assert float(hook_main.f(np.float64(1.0))) == 4.0
    (site / "lib.grad").write_text("op g(x) -> y { y = x + 2 }\n")
    assert importlib.reload(hook_main) is hook_main
    assert float(hook_main.f(np.float64(1.0))) == 6.0
    assert len(entries()) == 2
    importlib.reload(hook_main)                      # unchanged: the cached entry
    assert len(entries()) == 2


def test_a_compile_error_is_the_gradc_error_with_its_position(site) -> None:
    (site / "hook_bad.grad").write_text("op f(x) -> y {\n    y = tanhh(x)\n}\n")
    gradc.install_import_hook()
    with pytest.raises(gradc.GradcError) as info:
        import hook_bad  # noqa: F401
    text = str(info.value)
    assert f"{(site / 'hook_bad.grad').resolve()}:2:9: error[E201]: unknown function 'tanhh'" in text
    assert "    2 |     y = tanhh(x)\n      |         ^^^^^" in text
    assert "hook_bad" not in sys.modules


def test_options_reach_the_compiler_and_installing_again_replaces(site) -> None:
    (site / "hook_ops.grad").write_text("op f(x) -> y { y = 2 * x }\n")
    gradc.install_import_hook()
    second = gradc.install_import_hook(fuse=False)
    assert [f for f in sys.meta_path if isinstance(f, GradFinder)] == [second]
    import hook_ops  # noqa: F401
    assert [e.meta["options"] for e in entries()] == [{"fuse": False}]


def test_find_spec_does_not_compile(site) -> None:
    (site / "hook_ops.grad").write_text("op f(x) -> y { y = q }\n")     # an error
    gradc.install_import_hook()
    spec = importlib.util.find_spec("hook_ops")
    assert spec.origin == str((site / "hook_ops.grad").resolve()) and not entries()
    assert importlib.util.find_spec("hook_no_such_module") is None


def test_the_hook_and_gradc_load_share_numba_s_cache(site) -> None:
    """Kernels compiled in a module imported by the hook are in Numba's on-disk cache
    under the cache entry's module name, so another process loads them whether it
    uses gradc.load or the hook (Numba imports the module its cache records)."""
    src = site / "hook_ops.grad"
    src.write_text("op f(x) -> y { y = 2 * x }\n")
    gradc.install_import_hook()
    import hook_ops
    np.testing.assert_array_equal(hook_ops.f(np.ones(2, np.float32)), [2.0, 2.0])
    loaded = gradc.load(src)
    assert hook_ops.OPS is loaded.OPS and hook_ops.__gradc_module__ == loaded.__name__
    assert list((site.parent / "cache" / "__pycache__").glob(f"{loaded.__name__}.*.nbi"))
    for how in (f"gradc.load({str(src)!r})",
                f"(gradc.install_import_hook(), __import__('hook_ops'))[1]"):
        code = f"import gradc, numpy as np; print({how}.f(np.ones(2, np.float32)))"
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             cwd=site, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        assert run.returncode == 0 and run.stdout == "[2. 2.]\n", run.stderr
