"""PyTorch adapter: the ops of a generated module as differentiable PyTorch functions.

``as_torch(op)`` turns an op of a generated module (``gradc.load(path).NAME``) into a
function of tensors whose forward pass, backward pass (VJP), forward mode (JVP) and
double backward are the module's fused kernels:

* CPU tensors reach the kernels zero-copy through NumPy (``tensor.detach().numpy()``,
  marked read-only, as JAX's arrays are: one compile of a kernel serves both adapters;
  non-contiguous tensors are copied by the module's wrappers, as any NumPy input) and
  come back through ``torch.from_numpy``; CUDA tensors go through
  ``__cuda_array_interface__`` to the op's ``.cuda`` methods (modules compiled with
  ``target="cuda"`` or ``"all"``), on the current PyTorch stream.
* In eager mode (and under ``torch.func``) the function is a
  ``torch.autograd.Function`` in the ``setup_context`` style, with ``jvp`` (the op's
  ``.jvp``) and ``vmap`` (one call per batch element).  Its ``backward`` is another such
  Function, whose forward is the op's ``.vjp`` and whose own backward is the VJP of the
  derived op ``NAME__vjp`` that :mod:`gradc.adapters.derived` compiles from the op's
  source on first use (the JAX adapter's): double backward (and higher) from
  generated kernels.  As for any Function, PyTorch differentiates the forward's
  output by the Function's backward at every order: with a loss nonlinear in the
  output (``sum(f(x) ** 2)``) the custom rule is used again where JAX (and
  ``as_jax``) differentiate the forward body (docs/frameworks.md).
* Under ``torch.compile`` the same levels are ``torch.library.custom_op`` operators
  (``gradc::...``) with ``register_autograd`` and ``register_fake``, so Dynamo traces
  through them without a graph break (PyTorch refuses to trace an autograd.Function
  that defines ``jvp``).

Arguments: one per parameter without a default, in order (tensors; Python numbers
are made tensors of the float dtype of the tensor arguments, or of an integer
parameter's dtype), then the keyword-only parameters by name (Python numbers or
0-d tensors).  An op that draws random numbers also takes ``seed=`` (an int, a 0-d
integer tensor, or None: a fresh seed per call, as the module draws it; under
``torch.compile`` from ``torch.randint`` in the graph); it is one of the
Function's arguments, saved with the inputs, so the backward, the JVP and the
double backward of a call draw its forward's numbers.  Results are tensors of
the module's dtypes (float32 in, float32 out), one or a tuple, on the inputs'
device.  Errors are the module's
(``TypeError``, ``ValueError`` naming the argument), ``NotImplementedError`` for
forward mode of an op without a JVP (E405) and for double backward of an op that
gradc cannot differentiate again (several outputs, or a module imported without
its recorded source), ``RuntimeError`` where gradc cannot compile the derived op
(the compiler's error attached).  See docs/frameworks.md.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np

try:
    import torch
except ImportError as exc:          # the optional extra
    raise ImportError("gradc.adapters.torch needs PyTorch: pip install \"gradc[torch]\" "
                      "(or the CPU build, pip install \"torch==2.13.0+cpu\")") from exc

from gradc.adapters import derived
from gradc.codegen.runtime_src import call_seed
from gradc.ir.lower import ParamInfo

__all__ = ["as_torch", "TorchOp"]

_INT_DTYPES = {"i32": torch.int32, "i64": torch.int64, "bool": torch.bool}
_CPU = torch.device("cpu")
_LEVELS: dict[int, "_Level"] = {}


def as_torch(op, *, source=None) -> "TorchOp":
    """The PyTorch function of ``op``, an op of a generated module (one per op:
    calling this twice returns functions that share their Functions and custom
    operators).  ``source``: the op's .grad file, for the double backward of a module
    not loaded by ``gradc.load`` (``gradc compile -o``), as for ``as_jax``.  Raises
    TypeError for what is not such an op (a method, a NumPy function)."""
    derived.require_op(op, "as_torch")
    level = _LEVELS.get(id(op))
    if level is None:
        params, outputs = derived.signature_of(op)
        level = _LEVELS[id(op)] = _Level(_Signature(op.__name__, params, outputs,
                                                    derived.draws(op)), lambda: op,
                                         "forward", lambda: op,
                                         _cached(lambda: _source(op, source)),
                                         type(op).__module__, 0)
        level.custom_op()        # now: Dynamo cannot trace the registration
    return TorchOp(level)


@dataclass(frozen=True)
class _Signature:
    """What an order takes and gives: the op's name, the parameters of its flat
    arguments (:class:`gradc.ir.lower.ParamInfo`; those with a default are the
    keywords), its outputs, and whether it draws random numbers (then its flat
    arguments end with the call's seed, and every order's methods take ``seed=``)."""
    name: str
    params: tuple[ParamInfo, ...]
    outputs: tuple[str, ...]
    draws: bool = False

    @cached_property
    def positional(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if not p.has_default)

    @cached_property
    def keywords(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if p.has_default)

    @cached_property
    def differentiable(self) -> tuple[ParamInfo, ...]:
        return tuple(p for p in self.params if p.differentiable)


def _what(name: str) -> str:
    return f"the VJP of gradc op '{name}' as a differentiable op (double backward)"


def _source(op, file=None) -> derived.Source:
    """The source of ``op`` (:func:`gradc.adapters.derived.source_of`; ``file`` as
    its argument), for its derived ops; NotImplementedError where it is not known."""
    if file is None and derived.origin_of(op) is None:
        raise NotImplementedError(
            f"{_what(op.__name__)} needs the op's .grad source: load the module with "
            f"gradc.load(path), or pass as_torch(op, source='FILE.grad') (module "
            f"{type(op).__module__} was imported from a file gradc did not record)")
    try:
        return derived.source_of(op, file)
    except ValueError as exc:
        raise NotImplementedError(f"{_what(op.__name__)}: {exc}") from None


def _compile(src: derived.Source):
    """The derived op of ``src``, compiled; RuntimeError with the compiler's error."""
    from gradc.errors import GradcError
    try:
        return derived.compile_op(src)
    except GradcError as exc:
        raise RuntimeError(f"gradc could not compile the derived op '{src.name}' (double "
                           f"backward):\n{exc}") from exc


class TorchOp:
    """A gradc op as a PyTorch function: ``f(*tensors, **keywords)``; see the module
    docstring for arguments, results, errors and what each transform runs."""

    def __init__(self, level: "_Level"):
        self._level = level
        self.__name__ = level.info.name
        self.__doc__ = f"gradc op {level.info.name} for PyTorch (gradc.adapters.torch)"

    def __call__(self, *args, **kwargs):
        level = self._level
        if not kwargs and level.tensors_only(args):
            flat = args                 # the usual call: nothing to convert
        else:
            flat = level.bind(args, kwargs)
        if torch.compiler.is_compiling():
            return level.custom_op()(*flat)
        return level.apply(*flat)

    def __repr__(self):
        return f"<gradc op {self.__name__} for PyTorch>"


class _Level:
    """One order of an op: its values are ``call_op().<method>(...)`` (the op's
    forward at order 0, the previous order's ``vjp`` after), ``self_op()`` is a gradc
    op whose forward equals them (its ``jvp`` is this order's JVP; the op itself at
    order 0, the derived ``NAME__vjp`` after, compiled on first use), ``source()``
    that op's source (:mod:`gradc.adapters.derived`) and ``next()`` is the order that
    computes this one's VJP."""

    def __init__(self, info: _Signature, call_op, method: str, self_op, source, module: str,
                 order: int):
        self.info, self.call_op, self.method, self.self_op = info, call_op, method, self_op
        self.source, self.module, self.order = source, module, order
        self._next = self._function = self._jvp_function = self._custom_op = None
        self.n_pos, self.n_kw = len(info.positional), len(info.keywords)
        self.gradient_of = None     # after order 0: the arguments whose gradients it computes

    def tensors_only(self, args) -> bool:
        """Whether ``args`` is one tensor per positional parameter and the op has no
        keyword parameters (a call :meth:`bind` would leave as it is)."""
        return (not self.n_kw and not self.info.draws and len(args) == self.n_pos
                and all(type(a) is torch.Tensor or isinstance(a, torch.Tensor) for a in args))

    # ---- arguments ----------------------------------------------------------

    def bind(self, args, kwargs) -> list:
        """``args`` and ``kwargs`` as the flat list the Function and custom op take:
        positional tensors, then each keyword's value (None where not given), then,
        for an op that draws, the call's seed (:func:`_seed`): one value that the
        forward and the backward of the call both read."""
        info = self.info
        if len(args) != self.n_pos:
            raise derived.arity_error(info.name, [p.name for p in info.positional],
                                      [p.name for p in info.keywords], len(args))
        names = {p.name for p in info.keywords} | ({"seed"} if info.draws else set())
        for key in kwargs:
            if key not in names:
                raise TypeError(f"{info.name}() got an unexpected keyword argument {key!r}")
        floats = [a.dtype for a, p in zip(args, info.positional)
                  if isinstance(a, torch.Tensor) and p.dtype not in _INT_DTYPES]
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        dtype = _promote(floats) if floats else torch.get_default_dtype()
        flat = [a if isinstance(a, torch.Tensor) else
                torch.tensor(derived.integer_scalar(info.name, p, a),
                             dtype=_INT_DTYPES.get(p.dtype, dtype), device=device)
                for a, p in zip(args, info.positional)]
        for p in info.keywords:
            v = kwargs.get(p.name)
            if isinstance(v, torch.Tensor):
                if v.requires_grad:
                    warnings.warn(f"{info.name}: keyword argument '{p.name}' requires grad, but "
                                  "a parameter with a default is a constant (its value is "
                                  "read with .item()): it gets no gradient; make it a "
                                  "parameter without a default to differentiate it",
                                  stacklevel=3)
                if v.dim():
                    raise ValueError(f"{info.name}: argument '{p.name}' must be a scalar (a "
                                     "number or a 0-d tensor: a parameter with a default and "
                                     f"no shape annotation), got shape {tuple(v.shape)}")
                v = v.item()
            flat.append(v)
        if info.draws:
            flat.append(_seed(info.name, kwargs.get("seed")))
        return flat

    def split(self, flat, fake: bool = False):
        """The flat arguments as (positional tensors, keyword dict of those given),
        the seed as ``seed`` among the keywords where the op draws (an int; 0 for
        ``fake`` arguments, whose values cannot be read)."""
        given = zip(self.info.keywords, flat[self.n_pos:self.n_pos + self.n_kw])
        kw = {p.name: v for p, v in given if v is not None}
        if self.info.draws:
            seed = flat[self.n_pos + self.n_kw]
            kw["seed"] = 0 if fake else int(seed)      # an int, or a 0-d tensor (compile)
        return list(flat[:self.n_pos]), kw

    # ---- kernels ------------------------------------------------------------

    def run(self, flat) -> tuple:
        """This order's values (a tuple of tensors) from the generated kernels."""
        pos, kw = self.split(flat)
        return _invoke(self.call_op(), self.method, pos, kw, self.info.name)

    def run_jvp(self, flat, tangents) -> tuple:
        """This order's output tangents, from ``self_op().jvp``; ``tangents`` has one
        entry (a tensor or None) per positional argument."""
        pos, kw = self.split(flat)
        ts = [t if t is not None else 0.0
              for t, p in zip(tangents, self.info.positional) if p.differentiable]
        try:
            gop = self.self_op()
        except NotImplementedError as exc:
            raise NotImplementedError(f"forward mode over the VJP: {exc}") from exc
        try:
            values = _invoke(gop, "jvp", pos + ts, kw, self.info.name)
        except NotImplementedError as exc:
            raise NotImplementedError(
                f"gradc op '{self.info.name}' has no forward mode (torch.autograd.forward_ad, "
                f"torch.func.jvp); reverse mode (backward, torch.func.grad/vjp) works.\n{exc}"
            ) from None
        return values[len(self.info.outputs):]

    def next(self) -> "_Level":
        """The order that computes this one's VJP (its arguments: the positional
        ones, one cotangent per output, then the keywords: the positional order of
        the derived VJP op)."""
        if self._next is None:
            info = self.info
            cts = tuple(ParamInfo(f"ct_{o}", None, None, None, False, True)
                        for o in info.outputs)
            grads = tuple(f"d_{p.name}" for p in info.differentiable)
            nxt = _Signature(info.name, info.positional + cts + info.keywords, grads,
                             info.draws)
            parent = self.source
            source = _cached(lambda: derived.derive(parent(), "vjp"))
            self._next = _Level(nxt, self.self_op, "vjp", _cached(lambda: _compile(source())),
                                source, self.module, self.order + 1)
            self._next.gradient_of = [i for i, p in enumerate(info.positional)
                                      if p.differentiable]
        return self._next

    def gradients(self, flat, grads, needs, apply) -> tuple:
        """The backward pass: one gradient (or None) per flat argument, from
        ``apply(*flat_of_next_order)``."""
        if not any(n and p.differentiable for n, p in zip(needs, self.info.positional)):
            return (None,) * len(flat)
        pos = flat[:self.n_pos]
        values = apply(*pos, *grads, *flat[self.n_pos:])
        values = iter(values if isinstance(values, tuple) else (values,))
        out = []
        for p, a, need in zip(self.info.positional, pos, needs):
            g = next(values) if p.differentiable else None
            out.append(_like(g, a) if need and g is not None else None)
        return (*out, *([None] * (len(flat) - self.n_pos)))

    # ---- eager: torch.autograd.Function -------------------------------------

    def apply(self, *flat):
        """This order's values through its Function: outside torch.func's transforms
        the one whose ``forward`` takes ``ctx`` (:func:`_function_class`); where no
        graph is recorded (``no_grad``, a backward pass without ``create_graph``) and
        no forward-mode level is open, the kernels alone (a Function's apply and
        context cost 5-10 us a call, and would record nothing)."""
        if not torch.is_grad_enabled() and _no_dual_level() \
                and not torch._C._are_functorch_transforms_active():
            values = self.run(flat)
            return values[0] if len(values) == 1 else values
        if self._function is None:
            self._function = _make_function(self)
        return _apply(self._function, flat)

    def apply_jvp(self, *flat):
        """This order's output tangents through its JVP Function, as :meth:`apply`."""
        if self._jvp_function is None:
            self._jvp_function = _make_jvp_function(self)
        return _apply(self._jvp_function, flat)

    # ---- torch.compile: torch.library.custom_op -----------------------------

    def custom_op(self):
        if self._custom_op is None:
            self._custom_op = _make_custom_op(self)
        return self._custom_op


def _make_function(level: _Level):
    n_out = len(level.info.outputs)

    def forward(*flat):
        values = level.run(flat)
        return values[0] if n_out == 1 else values

    def setup_context(ctx, inputs, output):
        _save(ctx, inputs, for_forward=True)
        ctx.indices = {i for i, o in enumerate(_tuple(output)) if not o.is_floating_point()}

    def backward(ctx, *grads):
        return level.gradients(_restore(ctx), grads, ctx.needs_input_grad,
                               level.next().apply)

    def jvp(ctx, *tangents):            # through a Function: torch.func wraps ctx's tensors
        ts = level.apply_jvp(*_restore(ctx), *tangents[:level.n_pos])
        if not ctx.indices:
            return ts
        ts = tuple(None if i in ctx.indices else t for i, t in enumerate(_tuple(ts)))
        return ts[0] if n_out == 1 else ts      # an integer output (argmax) has no tangent

    return _function_class(f"{level.info.name}_order{level.order}", n_out, forward,
                           setup_context, backward, jvp)


def _make_jvp_function(level: _Level):
    """The Function ``(args..., tangents...) -> output tangents`` of ``level``: its
    backward is linear algebra on the next orders.  For cotangents ``u`` of the
    output tangents ``J(x) t``: ``J(x)^T u``, the VJP, for ``t``; ``d/dx <t, J(x)^T
    u>``, the next order's VJP at cotangent ``t``, for ``x``."""
    n_out, n_pos = len(level.info.outputs), level.n_pos
    diff = [i for i, p in enumerate(level.info.positional) if p.differentiable]

    def forward(*flat):
        values = level.run_jvp(flat[:-n_pos], flat[-n_pos:])
        return values[0] if n_out == 1 else values

    def setup_context(ctx, inputs, output):
        _save(ctx, inputs)

    def backward(ctx, *us):
        flat = _restore(ctx)
        args, ts = flat[:-n_pos], flat[-n_pos:]
        pos, kw = args[:n_pos], args[n_pos:]
        d_t = _tuple(level.next().apply(*pos, *us, *kw))
        t_diff = [ts[i] if ts[i] is not None else torch.zeros_like(pos[i]) for i in diff]
        d_x = _tuple(level.next().next().apply(*pos, *us, *t_diff, *kw))
        grads = [None] * len(flat)
        for k, i in enumerate(diff):
            grads[i], grads[len(args) + i] = _like(d_x[k], pos[i]), _like(d_t[k], pos[i])
        return tuple(g if need else None for g, need in zip(grads, ctx.needs_input_grad))

    def jvp(ctx, *tangents):
        raise NotImplementedError(f"gradc op '{level.info.name}': forward mode over forward "
                                  "mode is not supported (use reverse mode over forward mode)")

    return _function_class(f"{level.info.name}_jvp{level.order}", n_out, forward,
                           setup_context, backward, jvp)


def _save(ctx, inputs, for_forward: bool = False) -> None:
    """Save a Function's inputs: tensors through ``save_for_backward`` (and
    ``save_for_forward``, for its ``jvp``), the other arguments on ``ctx``."""
    tensors = [a for a in inputs if isinstance(a, torch.Tensor)]
    ctx.others = [None if isinstance(a, torch.Tensor) else (a,) for a in inputs]
    ctx.save_for_backward(*tensors)
    if for_forward:
        ctx.save_for_forward(*tensors)


def _restore(ctx) -> list:
    """The inputs :func:`_save` saved."""
    saved = iter(ctx.saved_tensors)
    return [next(saved) if a is None else a[0] for a in ctx.others]


def _tuple(v) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def _function_class(name, n_out, forward, setup_context, backward, jvp) -> tuple:
    """Two ``torch.autograd.Function`` subclasses of these static methods: one with
    ``setup_context`` and a ``vmap`` that calls it once per batch element and stacks
    the results, for torch.func's transforms (which take that form alone), and one
    whose ``forward(ctx, *flat)`` runs ``forward`` and ``setup_context`` in turn, for
    every other call (:func:`_apply`): PyTorch binds each call's arguments to the
    first form's ``forward`` with ``inspect.signature`` (14 of the 20 us of an apply
    of a (8, 64) tensor, torch 2.14), the second's not."""
    def vmap(info, in_dims, *flat):
        rows = []
        for b in range(info.batch_size):
            args = [a.select(d, b) if d is not None else a for a, d in zip(flat, in_dims)]
            rows.append(_tuple(function.apply(*args)))
        stacked = tuple(torch.stack(col) for col in zip(*rows))
        return (stacked[0], 0) if n_out == 1 else (stacked, (0,) * n_out)

    def forward_with_ctx(ctx, *flat):
        output = forward(*flat)
        setup_context(ctx, flat, output)
        return output

    doc, name = f"gradc op {name} (gradc.adapters.torch)", re.sub(r"\W", "_", name)
    function = type(name, (torch.autograd.Function,), {
        "forward": staticmethod(forward), "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward), "jvp": staticmethod(jvp),
        "vmap": staticmethod(vmap), "__doc__": doc})
    eager = type(f"{name}_eager", (torch.autograd.Function,), {
        "forward": staticmethod(forward_with_ctx), "backward": staticmethod(backward),
        "jvp": staticmethod(jvp), "__doc__": doc})
    return function, eager


def _no_dual_level() -> bool:
    """Whether no ``torch.autograd.forward_ad.dual_level`` is open (then no tensor has
    a tangent; False where this torch does not say)."""
    return getattr(torch.autograd.forward_ad, "_current_level", 0) < 0


def _apply(functions: tuple, flat):
    """``Function.apply(*flat)`` of a pair of :func:`_function_class`: the form with
    ``setup_context`` under torch.func's transforms, else the other."""
    function, eager = functions
    if torch._C._are_functorch_transforms_active():
        return function.apply(*flat)
    return eager.apply(*flat)


def _make_custom_op(level: _Level):
    info, n_out = level.info, len(level.info.outputs)
    qualname = "gradc::" + re.sub(r"\W", "_", f"{level.module}__{info.name}__{level.order}")
    args = [f"Tensor a{i}" for i in range(level.n_pos)]
    args += [f"Scalar? k{i}=None" for i in range(len(info.keywords))]
    args += ["Tensor? seed=None"] if info.draws else []     # a 0-d int64 tensor: traced
    outs = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    schema = f"({', '.join(args)}) -> {outs}"

    def impl(*flat):
        values = level.run(flat)
        return values[0] if n_out == 1 else values

    lib_op = torch.library.custom_op(qualname, impl, mutates_args=(), schema=schema)
    lib_op.register_fake(lambda *flat: _fake(level, flat))

    def setup_context(ctx, inputs, output):
        _save(ctx, inputs)          # the seed too: the backward draws the forward's numbers

    def backward(ctx, *grads):
        return level.gradients(_restore(ctx), grads, ctx.needs_input_grad,
                               level.next().custom_op())

    lib_op.register_autograd(backward, setup_context=setup_context)
    return lib_op


def _fake(level: _Level, flat):
    """Empty tensors of the shapes and dtypes of this order's results (for
    ``torch.compile``): a gradient has its parameter's shape; the forward's shapes
    come from one run of the kernels on zero-stride arrays of the inputs' shapes."""
    pos = flat[:level.n_pos]
    device = pos[0].device if pos else torch.device("cpu")
    if level.gradient_of is not None:
        dtype = _promote([a.dtype for a, p in zip(pos, level.info.positional)
                          if p.dtype not in _INT_DTYPES])
        res = [torch.empty(pos[i].shape, dtype=dtype, device=device) for i in level.gradient_of]
    else:
        proxies = [np.broadcast_to(np.zeros((), _numpy_dtype(a.dtype)),
                                   tuple(int(s) for s in a.shape)) for a in pos]
        _, kw = level.split(flat, fake=True)
        got = level.call_op()(*proxies, **kw)
        got = got if isinstance(got, tuple) else (got,)
        res = [torch.empty(np.shape(g), dtype=_torch_dtype(np.asarray(g).dtype), device=device)
               for g in got]
    return res[0] if len(res) == 1 else tuple(res)


def _seed(name: str, seed):
    """The seed of one call of an op that draws, from its ``seed=``: an int, a 0-d
    integer tensor, or None.  In eager mode an int, the module's (its low 64 bits as
    an int64; where None, 64 fresh bits of the operating system's entropy, as the
    generated module draws them).  Under ``torch.compile`` a 0-d int64 tensor, the
    custom operators' argument: where None, ``torch.randint`` in the graph (a fresh
    seed per call of the compiled function, from PyTorch's generator), since a seed
    drawn while Dynamo traces would be the same in every call."""
    if isinstance(seed, torch.Tensor):
        if seed.dim() or seed.dtype.is_floating_point or seed.dtype.is_complex \
                or seed.dtype == torch.bool:
            raise TypeError(f"{name}: seed= must be an int or a 0-d integer tensor, got a "
                            f"{seed.dtype} tensor of shape {tuple(seed.shape)}")
        if torch.compiler.is_compiling():
            return seed.to(torch.int64)
        seed = seed.item()
    if not torch.compiler.is_compiling():
        return call_seed(name, seed)
    if seed is None:
        return torch.randint(0, 2**63 - 1, (), dtype=torch.int64)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name}: seed= must be an int, got {type(seed).__name__}")
    return torch.tensor((seed + 2**63) % 2**64 - 2**63, dtype=torch.int64)


def _invoke(gop, method: str, args, kwargs, name: str) -> tuple:
    """``gop.<method>(*args, **kwargs)`` on CPU tensors through NumPy, or on CUDA
    tensors through the op's ``.cuda`` methods; the results as a tuple of tensors."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), _CPU)
    if device.type == "cuda":
        return _invoke_cuda(gop, method, args, kwargs, name, device)
    if device.type != "cpu":
        raise TypeError(f"{name}: tensors on {device.type} are not supported (CPU or CUDA)")
    arrays = [_to_numpy(a, name) if isinstance(a, torch.Tensor) else a for a in args]
    fn = gop if method == "forward" else getattr(gop, method)
    got = _advised(fn, arrays, kwargs)
    got = got if isinstance(got, tuple) else (got,)
    inputs = [a for a in arrays if isinstance(a, np.ndarray)]
    given = {id(a) for a in inputs}
    return tuple(_from_numpy(g, inputs, given) for g in got)


def _invoke_cuda(gop, method, args, kwargs, name, device):
    from numba import cuda
    try:
        target = gop.cuda
    except (AttributeError, NotImplementedError) as exc:
        raise TypeError(f"{name}: CUDA tensors need a module compiled with target='cuda' "
                        f"or 'all' (gradc.load(path, target='all')): {exc}") from None
    fn = target if method == "forward" else getattr(target, method)
    stream = cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)
    arrays = [a.detach().contiguous() if isinstance(a, torch.Tensor) else a for a in args]
    got = _advised(fn, arrays, dict(kwargs, stream=stream))
    got = got if isinstance(got, tuple) else (got,)
    return tuple(torch.as_tensor(g, device=device) for g in got)


_ASTYPE = re.compile(r"\(convert with \.astype\(np\.(\w+)\)\)")


def _advised(fn, args, kwargs):
    """``fn(*args, **kwargs)``, where a module's dtype error advises NumPy's
    ``.astype(np.float32)`` advising torch's ``.to(torch.float32)`` instead."""
    try:
        return fn(*args, **kwargs)
    except TypeError as exc:
        text = str(exc)
        if len(exc.args) == 1 and _ASTYPE.search(text):
            exc.args = (_ASTYPE.sub(r"(convert with .to(torch.\1))", text),)
        raise


def _to_numpy(t: torch.Tensor, name: str) -> np.ndarray:
    """The tensor's memory as a read-only NumPy array: the kernels only read their
    inputs, and JAX hands them read-only arrays too, so that one compile of a kernel
    (Numba's types tell read-only arrays apart) serves both adapters."""
    if t.layout != torch.strided:       # sparse (COO, CSR...), MKL-DNN: no NumPy view
        raise TypeError(f"{name}: a tensor of layout {t.layout} is not supported; pass a "
                        "dense (strided) tensor, e.g. t.to_dense()")
    t = t.detach().resolve_conj().resolve_neg()
    try:
        a = t.numpy()
    except TypeError:
        raise TypeError(f"{name}: a {t.dtype} tensor has no NumPy dtype; use float16, "
                        "float32 or float64 (or an integer/bool dtype for such parameters)"
                        ) from None
    a.flags.writeable = False           # a new array object: the tensor stays writable
    return a


def _from_numpy(a, inputs, given=()) -> torch.Tensor:
    """A result as a tensor sharing its memory; a copy where it is an input's memory
    (PyTorch operators must not return views of their inputs) or read-only.  An array
    that owns its memory and is none of the inputs (``given``: their ids) is none of
    their memory: the kernels' results, without NumPy's overlap test per input."""
    a = np.asarray(a)
    if a.base is None and id(a) not in given and a.flags.writeable:
        return torch.from_numpy(a)
    if not a.flags.writeable or any(np.may_share_memory(a, i) for i in inputs):
        a = a.copy()
    return torch.from_numpy(a)


def _like(g: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """A gradient in its input's dtype (the kernels compute in the common dtype)."""
    return g if g.dtype == a.dtype or not a.is_floating_point() else g.to(a.dtype)


def _promote(dtypes) -> torch.dtype:
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


_DTYPES = {torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
           torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_}


def _numpy_dtype(dtype: torch.dtype):
    """The NumPy dtype of a torch dtype (a table: no tensor is made, so it works
    under fake tensors too)."""
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise TypeError(f"a {dtype} tensor has no gradc dtype; use float16, float32 or "
                        "float64 (or int32, int64, bool for such parameters)") from None


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return next(t for t, n in _DTYPES.items() if np.dtype(n) == dtype)


def _cached(thunk):
    box = []

    def get():
        if not box:
            box.append(thunk())
        return box[0]
    return get
