"""JAX adapter: a gradc op as a JAX function (``jax.custom_vjp`` or ``jax.custom_jvp``).

``as_jax(m.scaled_tanh)`` is a function of JAX arrays that computes the op and
differentiates it as gradc does: its custom rules, its derivatives.  Two
lowerings compute the values:

* ``lowering="xla"`` (the default): the op's graph, and the graphs of the
  derivatives gradc derives from its rules, written with ``jax.numpy``
  (:mod:`gradc.adapters.framework_lowering`), so that XLA compiles them with the
  ops around the call and fuses them there, as it fuses ``jax.nn.silu``, on
  every device JAX runs on.  Inside ``jax.jit`` this is the fast path: a
  callback is a wall XLA cannot fuse across, and it waits for the host.
* ``lowering="kernels"``: gradc's own kernels (the op's module, and the derived
  ops' modules) through ``jax.pure_callback``: on the CPU they read and write
  host memory.  For code XLA compiles poorly, measured with ``gradc bench``.

Either way the derivatives come from the op's own methods' definitions:

* ``mode="rev"`` (the default): a ``jax.custom_vjp``.  Its ``fwd`` calls the
  op's forward and keeps the inputs as residuals; its ``bwd`` calls ``vjp``,
  which recomputes what it needs from the inputs in one fused pass.
  ``jax.grad``, ``jax.vjp`` and ``jax.jacrev`` work, to any order: ``bwd`` is
  itself a ``custom_vjp`` whose ``bwd`` calls the ``vjp`` of the op's VJP,
  derived by gradc on first use (:mod:`gradc.adapters.derived`).  As JAX
  differentiates its own ``custom_vjp``, ``fwd``'s primal output is
  differentiated through the forward body at second order (a ``custom_vjp``
  over the op without its grad block, :func:`gradc.adapters.derived.primal`),
  not through the rule again.  Forward mode (``jax.jvp``) raises JAX's error
  for ``custom_vjp`` functions.
* ``mode="fwd"``: a ``jax.custom_jvp`` whose rule calls the op's ``jvp``;
  ``jax.jvp`` and ``jax.jacfwd`` work, to any order (the rule's tangent is a
  ``custom_jvp`` over the op's JVP op).  Reverse mode works with the "xla"
  lowering, where JAX transposes the rule's ``jax.numpy`` code (so the rule's
  products are JAX's: 0 * inf is NaN, where the op's ``jvp`` masks it to 0 at a
  zero tangent, a test JAX cannot transpose), and not with
  "kernels": a callback has no transpose.  An op without forward
  mode (a grad block not linear in its upstream, E405) raises
  NotImplementedError with the compiler's error.

Shapes and dtypes of the results (``jax.ShapeDtypeStruct``) come from the op's
IR, evaluated abstractly with ``jax.eval_shape``; the dtype rule is the
module's (float32 in, float32 out; float16 in, float16 out; float64
needs ``jax_enable_x64``).  Arguments are checked when JAX traces the call, so
a bad dtype or shape is a TypeError or ValueError there, never an error inside a
callback.  Keyword parameters (defaults such as ``alpha``) are static: Python
numbers, fixed when the function is traced.  ``nograd`` parameters are
constants to JAX (their cotangent and tangent are zero), as are integer ones.

An op that draws random numbers takes ``seed=``, required (a JAX function is
pure: a seed drawn at trace time would be fixed in every call of a jitted
function): an int, an integer scalar array or a JAX PRNG key, traced like the
arrays (:func:`_seed_words`: the same 64 bits as the module's ``seed=``, so the
same numbers).  It is an argument of the ``custom_vjp``/``custom_jvp`` of its
own, not differentiated, that every derivative reads: the backward draws the
forward's numbers.

Under ``jax.vmap``, the "xla" lowering is batched by JAX as its own code is.
With "kernels", an elementwise op (every node elementwise, no annotated
shape) is called once for the whole batch, ``vmap_method="expand_dims"`` for
its forward and ``"broadcast_all"`` for its derivatives (a gradient of an
unbatched input must stay per-example, which a broadcast would sum); the
callback aligns the ranks so that the batch dims do not broadcast against the
op's own.  Any other op (reductions, matmuls, annotated ranks) is called once
per example (``"sequential"``): its kernels see the shapes it was written for.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import numpy as np

from gradc.adapters import derived
from gradc.ir.primitives import ELEMENTWISE, PRIMITIVES, SOURCE

_FLOATS = {"f16": np.float16, "f32": np.float32, "f64": np.float64}
_INTS = derived.INTEGER_DTYPES
MODES = ("rev", "fwd")
LOWERINGS = ("xla", "kernels")


def as_jax(op, *, mode: str = "rev", lowering: str = "xla", source=None) -> "JaxOp":
    """The gradc op ``op`` (``gradc.load(path).NAME``) as a JAX function.

    ``mode``: "rev" (a ``jax.custom_vjp``) or "fwd" (a ``jax.custom_jvp``);
    ``lowering``: "xla" (``jax.numpy``, fused by XLA) or "kernels" (gradc's
    kernels through ``jax.pure_callback``), see the module docstring.
    ``source``: the op's .grad file, for a module not loaded by ``gradc.load``
    (``gradc compile -o``).  Raises ValueError for an unknown mode, lowering or
    source, TypeError for what is not an op of a generated module (a method, a
    NumPy function), NotImplementedError for ``mode="fwd"`` on an op without
    forward mode (E405) and for an op its module could not compile."""
    derived.require_op(op, "as_jax")
    if mode not in MODES:
        raise ValueError(f"mode must be 'rev' or 'fwd', got {mode!r}")
    if lowering not in LOWERINGS:
        raise ValueError(f"lowering must be 'xla' or 'kernels', got {lowering!r}")
    return JaxOp(op, mode, derived.source_of(op, source), lowering)


class JaxOp:
    """A gradc op as a JAX function: ``f(*inputs, **keywords)``, inputs as for the
    op's forward (JAX arrays, NumPy arrays, Python numbers), one output or a tuple."""

    def __init__(self, op, mode: str, src: derived.Source, lowering: str = "xla") -> None:
        try:                        # fail here, not at the first call
            import jax  # noqa: F401
        except ImportError as exc:
            raise ImportError("gradc.adapters.jax needs JAX: pip install 'gradc[jax]'") from exc
        from gradc.ir.lower import lower_op
        self.op, self.mode, self.lowering, self.__name__ = op, mode, lowering, op.__name__
        for method in ("forward", "vjp") + (("jvp",) if mode == "fwd" else ()):
            why = _missing(op, method)
            if why:
                raise NotImplementedError(f"{op.__name__}: no {method} for mode={mode!r}: {why}")
        self._src = src
        self._params = [p for p in src.params if not p.has_default]
        self._defaults = {p.name: p.default for p in src.params if p.has_default}
        program = src.program
        self._graph = lower_op(program.ops[src.name], program.ops, program.consts)
        self._elementwise = all(p.shape is None for p in self._params) and all(
            PRIMITIVES[n.op].kind in (ELEMENTWISE, SOURCE) for n in self._graph)
        self._draws = derived.draws(op)
        self._fns: dict[tuple, Callable] = {}
        self._shapes: dict[tuple, tuple] = {}

    def __repr__(self) -> str:
        return (f"<JAX ({self.mode}, {self.lowering}) gradc op "
                f"{self.__name__}{self.op.signature}>")

    def __call__(self, *args, **keywords):
        seed = (_seed_words(self.__name__, keywords.pop("seed", None)),) if self._draws else ()
        kw = self._keywords(keywords)
        args = _arrays(self.__name__, self._params, args)
        _check_args(self.__name__, self._params, args, list(self._defaults))
        self._out_specs(dict(kw), args)       # shapes that do not fit: the op's ValueError
        fn = self._fns.get(kw)
        if fn is None:
            fn = self._fns[kw] = self._function(dict(kw))
        out = fn(*args, *seed)
        return out[0] if len(out) == 1 else out

    def _keywords(self, keywords: dict) -> tuple:
        import jax
        unknown = sorted(set(keywords) - set(self._defaults))
        if unknown:
            raise TypeError(f"{self.__name__}() got an unexpected keyword argument "
                            f"{unknown[0]!r}")
        out = dict(self._defaults)
        for k, v in keywords.items():
            if isinstance(v, jax.core.Tracer) or np.ndim(v) != 0:
                raise TypeError(f"{self.__name__}: keyword parameter '{k}' is static in "
                                f"the JAX adapter: pass a Python number, got {type(v).__name__}")
            out[k] = np.asarray(v).item()
            if not isinstance(out[k], (int, float)):      # a str, None, a complex
                raise TypeError(f"{self.__name__}: keyword parameter '{k}' must be a real "
                                f"number, got {type(v).__name__}")
        return tuple(sorted(out.items()))

    def _function(self, kw: dict) -> Callable:
        n_out = len(self._src.outputs)
        fn = _Fn(self.__name__, tuple(p.differentiable for p in self._params), n_out,
                 partial(_call_op, self.op, kw), partial(self._out_specs, kw),
                 lambda: self._src, lambda: self.op, kw,
                 "expand_dims" if self._elementwise and not self._draws else "sequential",
                 self.lowering, lambda: (self._src.compiled.methods["forward"].graph, 0),
                 self._draws)
        return fn.rev() if self.mode == "rev" else fn.fwd()

    def _out_specs(self, kw: dict, args: tuple) -> tuple:
        """The results' ShapeDtypeStructs: the IR's outputs evaluated abstractly."""
        import jax
        from gradc.adapters.framework_lowering import jax_framework, lower_graph, want_dtype
        key = (tuple(kw.items()), *((tuple(a.shape), np.dtype(a.dtype)) for a in args))
        if key not in self._shapes:
            floats = [np.dtype(a.dtype) for a, p in zip(args, self._params)
                      if p.dtype not in _INTS]
            rt = _float_dtype(floats)
            g = self._graph
            run = lower_graph(g, g.params, g.outputs, jax_framework(), rt)
            values = iter(args)
            full = [kw[p.name] if p.has_default else next(values) for p in self._src.params]
            arrays = [i for i, p in enumerate(self._src.params) if not p.has_default]

            def forward(*xs):
                vals = list(full)
                for i, x in zip(arrays, xs):
                    vals[i] = x
                return run(*vals)

            try:
                outs = jax.eval_shape(forward, *(jax.ShapeDtypeStruct(a.shape, a.dtype)
                                                 for a in args))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{self.__name__}: arguments of shapes "
                                 f"{[tuple(a.shape) for a in args]} do not fit: {exc}") from None
            self._shapes[key] = tuple(   # argmax's int64 is int32 where x64 is off, as XLA's
                jax.ShapeDtypeStruct(o.shape, jax.dtypes.canonicalize_dtype(
                    want_dtype(g.node(nid).dtype, rt))) for o, nid in zip(outs, g.outputs))
        return self._shapes[key]


@dataclass(eq=False)
class _Fn:
    """A function of arrays that gradc kernels compute, and how to differentiate it.

    ``run`` computes it on NumPy arrays (the results as a tuple); ``specs`` gives
    the results' ShapeDtypeStructs for the arguments; ``source()`` is the gradc op
    whose methods differentiate it and ``op()`` that op compiled (both made on
    first use: a derivative's op is compiled only when it is differentiated).
    With ``lowering="xla"`` it is ``graph()`` in ``jax.numpy`` instead: the graph
    of the method that ``run`` calls (the op's forward, or the VJP or JVP of the
    op this one differentiates), as gradc plans it; no module is compiled.

    Where it ``draws`` random numbers, its last argument is the call's seed, two
    uint32 words (:func:`_seed_words`): an argument of its own, not differentiated
    (a ``custom_vjp`` residual, as the inputs are), that every derivative reads, so
    the backward draws the forward's numbers; ``run`` takes it as ``seed=``."""

    name: str
    diff: tuple[bool, ...]         # per argument: does it get a gradient / take a tangent
    n_out: int
    run: Callable[..., tuple]
    specs: Callable[[tuple], tuple]
    source: Callable[[], derived.Source]
    op: Callable[[], Any]
    keywords: dict
    vmap: str                      # "expand_dims", "broadcast_all" or "sequential"
    lowering: str                  # "xla": graph()'s outputs in jax.numpy; "kernels": run
    graph: Callable[[], tuple]     # (graph, index of its first output that is ours)
    draws: bool = False            # its last argument is the seed's two words
    # a JVP, which JAX transposes for reverse mode: its NaN-safe products plain ones
    tangents: bool = False
    _made: dict = field(default_factory=dict)

    def split(self, args: tuple) -> tuple[tuple, tuple]:
        """``args`` as (the arrays, the seed: a 1-tuple where it draws, else ())."""
        return (args[:-1], args[-1:]) if self.draws else (args, ())

    def __call__(self, args: tuple) -> tuple:
        import jax
        if self.lowering == "xla":
            return self._xla(*self.split(args))
        values, seed = self.split(args)
        specs = self.specs(values)
        host = partial(_host, self.run, tuple(np.ndim(a) for a in values), specs, self.draws)
        return tuple(jax.pure_callback(host, specs, *args, vmap_method=self.vmap))

    def _xla(self, args: tuple, seed: tuple) -> tuple:
        """``graph()``'s outputs from ``start`` on, on ``args``, the keywords and the
        ``seed`` (the value of the graph's ``seed`` node), in ``jax.numpy`` (float16
        computed in float32 and rounded at the end, as the generated module does)."""
        from gradc.adapters.framework_lowering import jax_framework, lower_graph, want_dtype
        graph, start = self.graph()
        names = [graph.node(p).attr("name") for p in graph.params]
        positional = [n for n in names if n not in self.keywords]
        # (a float0 is the cotangent of an integer result, which nothing reads)
        floats = [np.dtype(a.dtype) for a, n in zip(args, positional)
                  if graph.node(graph.params[names.index(n)]).dtype not in _INTS
                  and np.dtype(a.dtype).kind != "V"]
        rt = _float_dtype(floats)
        if ("xla", rt) not in self._made:
            compute = np.dtype(np.float32) if rt == np.float16 else rt
            fw = jax_framework()
            if self.tangents:
                # zero_masked(x, t) keeps 0 * inf at 0 where the tangent t is 0: a test
                # of a tangent's value, which JAX cannot transpose (its select asserts);
                # JAX's own JVPs give NaN there too
                fw = dataclasses.replace(fw, ops={**fw.ops, "zero_masked": lambda x, t: x})
            targets = graph.outputs[start:]
            seeds = [n.id for n in graph if n.op == "seed"] if seed else []
            self._made["xla", rt] = (
                lower_graph(graph, [*graph.params, *seeds], targets, fw, compute),
                tuple(want_dtype(graph.node(t).dtype, rt) for t in targets), len(seeds))
        run, dtypes, n_seeds = self._made["xla", rt]
        values = dict(zip(positional, args))
        outs = run(*(self.keywords[n] if n in self.keywords else values[n] for n in names),
                   *seed * n_seeds)
        return tuple(jax_framework().cast(o, dt) for o, dt in zip(outs, dtypes))

    def derivative(self, kind: str) -> "_Fn":
        """The function computing this one's VJP (``kind="vjp"``: of the arguments
        and one cotangent per result) or JVP (``"jvp"``: of the arguments and one
        tangent per differentiable argument)."""
        if kind in self._made:
            return self._made[kind]
        # The op whose method computes the derivative, compiled now, while JAX traces
        # (an error here is the caller's, not a callback's); the XLA lowering needs
        # its source only.
        n, kw = len(self.diff), self.keywords
        op = self.op() if self.lowering == "kernels" else None
        source = _once(lambda: derived.derive(self.source(), kind))
        methods = lambda: self.source().compiled.methods                # noqa: E731
        if kind == "vjp":
            wrt = [i for i, d in enumerate(self.diff) if d]
            fn = _Fn(f"{self.name}.vjp", self.diff + (True,) * self.n_out, len(wrt),
                     lambda *a, **seed: _tuple(op.vjp(*a, **kw, **seed)),
                     lambda args: tuple(_struct(args[i]) for i in wrt), source,
                     _once(lambda: derived.compile_op(source())), kw, _derived_vmap(self.vmap),
                     self.lowering, lambda: (methods()["vjp"].graph, 0), self.draws)
        else:
            why = _missing(op, "jvp") if op is not None else \
                self.source().compiled.missing.get("jvp")
            if why:
                raise NotImplementedError(f"{self.name}: no forward mode: {why}")
            fn = _Fn(f"{self.name}.jvp", self.diff + (True,) * sum(self.diff), self.n_out,
                     lambda *a, **seed: _tuple(op.jvp(*a, **kw, **seed))[self.n_out:],
                     lambda args: self.specs(args[:n]), source,
                     _once(lambda: derived.compile_op(source())), kw, _derived_vmap(self.vmap),
                     self.lowering, lambda: (methods()["jvp"].graph, self.n_out), self.draws,
                     tangents=True)
        self._made[kind] = fn
        return fn

    def primal(self) -> "_Fn":
        """This function, differentiated through its op's forward body: the same
        kernels, but its derivatives are those of the op without its grad block
        (:func:`gradc.adapters.derived.primal`); itself for an op without one.
        ``fwd`` returns its primal output through it, as JAX differentiates a
        ``custom_vjp``'s ``fwd`` at second order."""
        if "primal" not in self._made:
            src = derived.primal(self.source())
            self._made["primal"] = self if src is None else dataclasses.replace(
                self, source=lambda: src, op=_once(lambda: derived.compile_op(src)), _made={},
                graph=lambda: (src.compiled.methods["forward"].graph, 0))
        return self._made["primal"]

    def rev(self) -> Callable:
        """This function as a ``jax.custom_vjp`` (made once)."""
        if "rev" not in self._made:
            import jax

            @jax.custom_vjp
            def f(*args):
                return self(args)

            def fwd(*args):         # differentiable: an outer derivative sees fwd
                primal = self.primal()
                return (f if primal is self else primal.rev())(*args), args

            def bwd(args, cts):
                if not any(self.diff):
                    return (None,) * len(args)
                values, seed = self.split(args)     # the forward's seed: the same numbers
                grads = iter(self.derivative("vjp").rev()(*values, *cts, *seed))
                # each gradient in its primal's dtype (the VJP computes in the op's
                # compute dtype: a float16 x beside float32 weights gets float32 there)
                return tuple(_like(next(grads), a) if d else None
                             for a, d in zip(args, self.diff)) + (None,) * len(seed)

            f.defvjp(fwd, bwd)
            self._made["rev"] = f
        return self._made["rev"]

    def fwd(self) -> Callable:
        """This function as a ``jax.custom_jvp`` (made once)."""
        if "fwd" not in self._made:
            import jax

            @jax.custom_jvp
            def f(*args):
                return self(args)

            def rule(primals, tangents):
                out = f(*primals)
                ts = [t for t, d in zip(tangents, self.diff) if d]
                if not ts:
                    import jax.numpy as jnp
                    return out, tuple(jnp.zeros(o.shape, o.dtype) for o in out)
                values, seed = self.split(primals)
                return out, self.derivative("jvp").fwd()(*values, *ts, *seed)

            f.defjvp(rule)
            self._made["fwd"] = f
        return self._made["fwd"]


def _like(g, a):
    """Gradient ``g`` in the dtype of its primal ``a``, as JAX gives it."""
    return g if g.dtype == a.dtype else g.astype(a.dtype)


def _host(run: Callable, ranks: tuple, specs: tuple, draws: bool, *arrays) -> tuple:
    """The callback: ``run`` on the host arrays, results in the promised dtypes; where
    the function ``draws``, the last array is the seed's two words, given to ``run``
    as the int ``seed=`` they are (called per example under ``vmap``: "sequential").

    Under ``vmap`` with "expand_dims" or "broadcast_all" (elementwise ops only)
    every argument has the same number of leading batch dims; the op's own dims
    are right-aligned with size-1 dims so the batch dims meet only batch dims."""
    arrays = [np.asarray(a) for a in arrays]
    seed = {}
    if draws:
        *arrays, words = arrays
        seed = {"seed": int(words[0]) | int(words[1]) << 32}
    k = arrays[0].ndim - ranks[0] if arrays else 0
    batch: tuple = ()
    if k:
        top = max(ranks)
        arrays = [a.reshape(a.shape[:k] + (1,) * (top - r) + a.shape[k:])
                  for a, r in zip(arrays, ranks)]
        batch = np.broadcast_shapes(*(a.shape[:k] for a in arrays))
    outs = run(*arrays, **seed)
    return tuple(np.asarray(o, dtype=s.dtype).reshape(batch + tuple(s.shape))
                 for o, s in zip(outs, specs))


def _seed_words(name: str, seed):
    """The 64-bit seed of a call of an op that draws, as a uint32 array of its low and
    high words (the Philox key; the generated module's ``seed=``), from:

    * an int: its low 64 bits, as the generated module takes it;
    * an integer scalar array (NumPy or JAX, traced under ``jax.jit``): the integer it
      holds, so ``jnp.int32(-5)`` draws as ``seed=-5``;
    * a JAX PRNG key (``jax.random.key``, or the uint32 pair of
      ``jax.random.PRNGKey``): its two words, the high one first, as JAX stores
      ``key(s)``, so ``key(s)`` draws as ``seed=s`` (``0 <= s < 2**32``; any int64
      with x64, where JAX keeps its high word).

    TypeError for None (a JAX function is pure: a seed drawn here would be fixed
    into every call of a jitted function), a float, a bool, a key of another
    implementation or an array of another shape."""
    import jax
    import jax.numpy as jnp
    if isinstance(seed, np.ndarray) and seed.shape == () and seed.dtype.kind in "iu":
        seed = int(seed)                # all its bits, int64 too without x64
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        word = int(seed) % 2**64
        return jnp.asarray([word & 0xFFFFFFFF, word >> 32], dtype=jnp.uint32)
    dtype = getattr(seed, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(seed)
        if data.shape == (2,):
            return data[::-1]
    elif dtype is not None and np.dtype(dtype).kind in "iu":
        a = jnp.asarray(seed)
        if a.shape == (2,) and a.dtype == jnp.uint32:        # jax.random.PRNGKey's data
            return a[::-1]
        if a.shape == ():
            if a.dtype.itemsize == 8:
                lo, hi = a & 0xFFFFFFFF, (a >> 32) & 0xFFFFFFFF
            elif a.dtype.kind == "i":                        # sign-extended to 64 bits
                lo = jax.lax.bitcast_convert_type(a.astype(jnp.int32), jnp.uint32)
                hi = jnp.where(a < 0, jnp.uint32(0xFFFFFFFF), jnp.uint32(0))
            else:
                lo, hi = a, jnp.zeros_like(a)
            return jnp.stack([lo.astype(jnp.uint32), hi.astype(jnp.uint32)])
    if seed is None:
        raise TypeError(f"{name}: seed= is required: the op draws random numbers, and a "
                        "JAX function is pure; pass an int, an integer scalar array or a "
                        "jax.random key (a traced one under jax.jit: a new seed per call "
                        "without retracing)")
    what = f"{dtype} array of shape {tuple(np.shape(seed))}" if dtype is not None \
        else type(seed).__name__
    raise TypeError(f"{name}: seed= must be an int, an integer scalar array or a "
                    f"jax.random key (one key of two words), got {what}")


def _float_dtype(floats: list) -> np.dtype:
    """The float dtype an op computes in for float arguments of dtypes ``floats``
    (NumPy's promotion; float64 with none), as JAX has it (float32 without x64)."""
    import jax
    return np.dtype(jax.dtypes.canonicalize_dtype(np.result_type(*floats) if floats
                                                  else np.float64))


def _call_op(op, kw: dict, *arrays, **seed) -> tuple:
    return _tuple(op(*arrays, **kw, **seed))


def _tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _struct(a):
    import jax
    return jax.ShapeDtypeStruct(np.shape(a), a.dtype)


def _derived_vmap(method: str) -> str:
    return "broadcast_all" if method == "expand_dims" else method


def _once(make: Callable) -> Callable:
    """``make``, called on the first call only."""
    box: list = []
    return lambda: box[0] if box else box.append(make()) or box[0]


def _missing(op, method: str) -> str | None:
    """Why the generated op ``op`` has no ``method`` (None when it has one)."""
    if method in op._methods:
        return None
    return op._missing.get(method) or op._note or "not available"


def _arrays(name: str, params: list, args: tuple) -> tuple:
    """The arguments as JAX arrays, in JAX's dtypes (float64 needs x64); a Python
    number for an integer or bool parameter takes that parameter's dtype (not int64
    under x64), checked as the generated module checks it, and a Python int for a
    float parameter is the float it equals (the module takes ``f(3)`` as ``f(3.0)``;
    JAX would make it an int32 array, which the module rejects)."""
    import jax.numpy as jnp

    def array(a, p):
        if type(a) not in (bool, int, float, complex):
            return jnp.asarray(a)
        if p.dtype in _INTS:
            return jnp.asarray(derived.integer_scalar(name, p, a), dtype=_INTS[p.dtype])
        return jnp.asarray(float(a) if type(a) is int else a, dtype=_FLOATS.get(p.dtype))

    if len(args) != len(params):        # _check_args says so
        return tuple(jnp.asarray(a) for a in args)
    return tuple(array(a, p) for a, p in zip(args, params))


def _conversion(want: np.dtype) -> str:
    """How to get an array of ``want``: ``.astype``, and JAX's x64 switch for 64-bit
    dtypes where it is off (without it JAX makes every float64 array float32)."""
    import jax
    hint = f"convert with .astype(jnp.{want.name})"
    if want.itemsize == 8 and not jax.config.jax_enable_x64:
        hint += "; 64-bit arrays need jax.config.update('jax_enable_x64', True)"
    return hint


def _check_args(name: str, params: list, args: tuple, keywords: list[str]) -> None:
    """The checks of the generated wrappers, at trace time: count, dtype, rank,
    annotated and named dims (TypeError or ValueError naming the argument)."""
    if len(args) != len(params):
        raise derived.arity_error(name, [p.name for p in params], keywords, len(args))
    dims: dict = {}
    for p, a in zip(params, args):
        dt, shape = np.dtype(a.dtype), tuple(a.shape)
        want = _INTS.get(p.dtype) or _FLOATS.get(p.dtype)
        if want is None and dt.char not in "efd":
            raise TypeError(f"{name}: argument '{p.name}' must be a floating-point array "
                            f"(float16, float32 or float64), got {dt} (convert with "
                            f".astype(jnp.float32))")
        if want is not None and dt != want and not (
                p.dtype in _INTS and derived.integer_array_fits(dt, np.dtype(want))):
            raise TypeError(f"{name}: argument '{p.name}' must be {np.dtype(want).name}, "
                            f"got {dt} ({_conversion(np.dtype(want))})")
        if p.shape is None:
            continue
        if len(shape) != len(p.shape):
            raise ValueError(f"{name}: argument '{p.name}' must have {len(p.shape)} dim(s) "
                             f"[{', '.join(map(str, p.shape))}], got shape {shape}")
        for d, size in zip(p.shape, shape):
            first = dims.setdefault(d, (size, p.name)) if isinstance(d, str) else (d, None)
            if first[0] != size:
                where = f"dim '{d}' is {first[0]} in argument '{first[1]}'" if first[1] \
                    else f"dim {d} is fixed"
                raise ValueError(f"{name}: {where} but {size} in argument '{p.name}' "
                                 f"(shape {shape})")
