"""The machine-readable report of ``gradc check --json FILE|-``.

One JSON object (strict JSON: a non-finite error is ``null``)::

    {"spec": "examples/seed.grad", "seed": 0, "gradc": "0.1.0", "passed": true,
     "ops": [{"op": "scaled_tanh", "passed": true, "custom": true,
              "custom_rel_diff": 0.5, "note": "",
              "checks": [{"name": "vjp_vs_finite_differences", "error": 3.1e-11,
                          "tolerance": 1e-05, "passed": true},
                         {"name": "jvp_vs_vjp", "error": 0.0, "tolerance": 1e-09,
                          "passed": true},
                         {"name": "second_order", "error": 2.2e-10,
                          "tolerance": 0.0001, "passed": true}]}]}

Per op, ``checks`` lists each check run, in this order, with its relative
``error``, the ``tolerance`` it must stay under and whether it ``passed``:
``vjp_vs_finite_differences`` (the derived VJP against float64 central
differences), ``jvp_vs_vjp`` (the adjoint identity ``<J t, u> = <t, J^T u>``;
for an op without forward mode it has ``"error": null``, ``"passed": null`` and
the reason in ``"skipped"``) and ``second_order`` (forward mode over the VJP
against differences of the VJP).  ``custom`` says whether the op's gradient
uses a grad block; ``custom_rel_diff`` (custom ops only) is
``|custom - true| / |true|`` over random cotangents, information rather than a
check.  ``not_differentiated`` (where there are any) names the outputs written as
``stop_gradient(...)`` as a whole, left out of the checks (a zero cotangent).
``warnings`` (where there are any) are the compiler's warnings on the op, those
``gradc compile`` shows but W405, which ``jvp_vs_vjp``'s ``skipped`` says (``code``,
``message``, ``line``, ``column``); they fail nothing.
``audit`` (ops with a grad block of their own) is the custom-gradient audit
(``gradc.audit.custom_rules.AuditResult.to_dict``: ``kind`` exact/scaled/clipped/surrogate,
``summary``, ``surrogate`` as declared, and per gradient the evidence; see
docs/audit.md).  ``passed`` is true when every check that ran passed.  A file that
does not compile gets ``"passed": false``, no ops, and ``errors``: one object per
error (``code``, ``message``, ``file``, ``line``, ``column``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from gradc.audit.gradcheck import TOL, TOL_ADJOINT, TOL_SECOND, CheckResult
from gradc.errors import GradcError, GradcErrors
from gradc.tools.term import write_output


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _check(name: str, error: float | None, tol: float) -> dict:
    passed = error is not None and error < tol     # NaN compares false: not passed
    return {"name": name, "error": _num(error), "tolerance": tol, "passed": passed}


def result_dict(r: CheckResult) -> dict:
    """One op's entry of the report (see the module docstring)."""
    checks = [_check("vjp_vs_finite_differences", r.error, TOL)]
    checks[0]["passed"] = bool(r.ok)        # also false for non-finite values
    if r.jvp_error is not None:
        checks.append(_check("jvp_vs_vjp", r.jvp_error, TOL_ADJOINT))
    else:
        checks.append({"name": "jvp_vs_vjp", "error": None, "tolerance": TOL_ADJOINT,
                       "passed": None, "skipped": r.jvp_missing or "not run"})
    checks.append(_check("second_order", r.second_error, TOL_SECOND))
    out = {"op": r.op, "passed": bool(r.passed), "custom": bool(r.custom),
           "note": r.note, "checks": checks}
    if r.custom:
        out["custom_rel_diff"] = _num(r.custom_rel_diff)
    if r.stopped:
        out["not_differentiated"] = list(r.stopped)
    if r.warnings:
        out["warnings"] = [{"code": w.code, "message": w.message,
                            "line": w.span.line if w.span else None,
                            "column": w.span.column if w.span else None} for w in r.warnings]
    audit = getattr(r, "audit", None)
    if audit is not None:
        out["audit"] = json.loads(json.dumps(audit.to_dict(), default=_num_or_str))
    return out


def _num_or_str(x):
    """JSON for the audit's values that json cannot write: NumPy numbers, spans."""
    try:
        return _num(float(x))
    except (TypeError, ValueError):
        return str(x)


def report_dict(spec: str | Path, results: Sequence[CheckResult], seed: int = 0,
                imported: Sequence = ()) -> dict:
    """The whole report of ``gradc check`` on ``spec``; ``imported``: the audits of
    imported ops' rules that its gradients use (``imported_rules``: a wrong one
    that is not marked ``surrogate`` fails the report)."""
    import gradc
    ops = [result_dict(r) for r in results]
    rules = [a.to_dict() for a in imported]
    passed = all(o["passed"] for o in ops) and all(a.warning is None for a in imported)
    return {"spec": str(spec), "seed": seed, "gradc": gradc.__version__,
            "passed": passed, "ops": ops, "imported_rules": rules}


def error_report(spec: str | Path, error: GradcError, seed: int = 0) -> dict:
    """The report of ``gradc check`` on a file that does not compile: no op checked,
    ``passed`` false, and each error (``code``, ``message``, its position)."""
    import gradc
    errors = error.errors if isinstance(error, GradcErrors) else [error]
    return {"spec": str(spec), "seed": seed, "gradc": gradc.__version__, "passed": False,
            "ops": [], "imported_rules": [],
            "errors": [{"code": e.code, "message": e.message,
                        "file": e.span.file if e.span else None,
                        "line": e.span.line if e.span else None,
                        "column": e.span.column if e.span else None} for e in errors]}


def write_report(report: dict, path: str | Path) -> None:
    """Write ``report`` as indented JSON to ``path``, or to stdout when it is ``-``."""
    write_output(path, json.dumps(report, indent=1, allow_nan=False) + "\n")
