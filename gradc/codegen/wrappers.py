"""The host wrappers of a generated module's ops, and the kernels they launch.

:class:`WrapperPrinter` prints the wrapper of one method of one op for one plan:
it validates the arguments, allocates or checks ``out=`` buffers, runs the plan's
steps (Numba kernels and NumPy library calls) and returns the results.  It is the
CPU target's printer and the base of the CUDA and Dask targets' printers
(:mod:`gradc.codegen.cuda_module`, :mod:`gradc.codegen.dask_module`);
:class:`Kernels` collects the kernels of a module, deduplicated.  The module text
around them is :mod:`gradc.codegen.module`'s.
"""
from __future__ import annotations

from pathlib import Path

from gradc.codegen.cpu import broadcast_rows, is_scalar_input, render_kernel, row_inputs
from gradc.codegen.cpu_reduce import render_reduce_kernel
from gradc.codegen.cuda import render_cuda_kernel
from gradc.codegen.cuda_reduce import render_cuda_reduce_kernel, split_kernels
from gradc.codegen.printer import IndentedBuffer
from gradc.codegen.quote import py_literal, py_name
from gradc.errors import CodegenError
from gradc.ir.graph import FLOAT, Graph
from gradc.ir.primitives import PRIMITIVES
from gradc.ir.shapes import Shape
from gradc.passes.fuse import Kernel, KernelPlan, LibraryCall, MatmulEpilogue, value_used
from gradc.passes import row_plan
from gradc.passes.fuse_reduce import ROW, ReduceKernel, cpu_plan
from gradc.passes.loop_ir import (CPU, GATHER_ROWS, gathered, lower, online, online_again,
                                  splits, static_rows, stores_after_reads)
from gradc.passes.row_schedule import PER_COL, PER_ROW, SCALAR, input_slots
from gradc.pipeline import CompiledOp, Method

OUT_DTYPE = {FLOAT: "_T", "i32": "np.int32", "i64": "np.int64", "bool": "np.bool_"}


# The kernel printers of each backend: a fused loop's, a reduce kernel's.
PRINTERS = {"cpu": (render_kernel, render_reduce_kernel),
            "cuda": (render_cuda_kernel, render_cuda_reduce_kernel)}


class Kernels:
    """The module's kernels for one backend ("cpu" or "cuda"), deduplicated by
    source text."""

    def __init__(self, fast_math: bool, backend: str = "cpu") -> None:
        self.fast_math = fast_math
        self.render, self.render_reduce = PRINTERS[backend]
        # Inputs its loops read per row, not broadcast first (CPU loops only).
        self.rows = row_inputs if backend == "cpu" else lambda graph, kernel: {}
        # Loops of run-time shapes that also run as rows, an input holding one row read
        # per row (CPU loops only).
        self.broadcast = broadcast_rows if backend == "cpu" else lambda graph, kernel: False
        # The kernels a reduce kernel's split rows launch (CUDA: listed in CUDA_KERNELS)
        self.split = split_kernels if backend == "cuda" else lambda graph, kernel, name: []
        self.by_body: dict[str, str] = {}
        # The segment functions of split rows by their text (CPU reduce kernels: one
        # function for the same pass of several methods, render_reduce_kernel)
        self.segments: dict[str, str] | None = {} if backend == "cpu" else None
        self.sources: list[str] = []
        self.arg_dtypes: dict[str, tuple[str, ...]] = {}   # kernel -> dtypes of its arrays

    def add(self, graph: Graph, kernel: Kernel, base: str, comments: tuple[str, ...]) -> str:
        render = self.render_reduce if isinstance(kernel, ReduceKernel) else self.render
        body = render(graph, kernel, "_K", fast_math=self.fast_math)
        if body in self.by_body:
            return self.by_body[body]
        name = base
        n = 0
        while name in self.by_body.values():
            n += 1
            name = f"{base}_{n}"
        self.by_body[body] = name
        if isinstance(kernel, ReduceKernel):     # partials (float64), input slots; _R, _N
            self.arg_dtypes[name] = tuple(graph.node(n).dtype for n in kernel.outputs) + (
                ("f64",) * len(kernel.partials)) + tuple(
                graph.node(x).dtype for x, _ in input_slots(graph, kernel)) + ("n", "n")
            arrays = len(kernel.outputs) + len(kernel.partials)
            for entry in self.split(graph, kernel, name):     # _sg after them, then _S
                own = self.arg_dtypes[name]
                self.arg_dtypes[entry] = own[:arrays] + ("f64",) + own[arrays:] + ("n",)
        else:
            self.arg_dtypes[name] = tuple(graph.node(n).dtype
                                          for n in (*kernel.outputs, *kernel.inputs)) + (
                ("i64", "i64", "n", "n", "n") if isinstance(kernel, MatmulEpilogue)
                else ())                          # the batches' offsets; m, n, k
        shared = {"segments": self.segments} if (
            isinstance(kernel, ReduceKernel) and self.segments is not None) else {}
        self.sources.append(render(graph, kernel, name, fast_math=self.fast_math,
                                   comments=comments, **shared))
        return name


class WrapperPrinter:
    """Prints the host wrapper of one method of one op for one plan.

    The CPU wrappers call the ``_g_`` helpers of :mod:`.runtime_src`; a
    backend's subclass names its own (``prefix``), passes them its extra
    keyword arguments (``extra_kw``) and prints kernel and library steps.
    """

    prefix = "_g_"
    extra_kw: tuple[tuple[str, str], ...] = ()     # (name, default) after out=
    label = ""                                     # errors name "op<label>.method"
    # NumPy arrays on the host: the usual call (no out=, the compute dtype the result
    # dtype, inputs as _g_inputs returns them) skips helpers it does not need
    host_fast_paths = True
    # The least elements a call runs a row plan for (None: _G_ROWS_MIN, see _g_row_shape)
    rows_min: int | None = None
    # A row plan's wrapper, which the op's own wrapper calls with its arguments checked
    # and converted already: ``_checked=(T, RT, dims)`` skips checking them again
    row_plan = False

    def __init__(self, cop: CompiledOp, method: Method, plan: KernelPlan, kernels: Kernels,
                 fn_name: str, kernel_base: str) -> None:
        self.cop, self.method, self.kernels = cop, method, kernels
        self.plan = self.lower_plan(plan)
        self.graph = self.plan.graph     # lowering may add nodes (pass-through results)
        self.fn_name, self.kernel_base = fn_name, kernel_base
        self.buf = IndentedBuffer()
        self.vars: dict[int, str] = {}
        self.after_blas = False       # a matmul step has been printed
        self.fresh: set[int] = set()  # results stored by a kernel in a buffer of their shape
        self.sig = f"_SIG_{py_name(cop.op.name)}"     # the signature's variable
        # Row plans to try first, (RowVariant, wrapper name, the (out, input) pairs its
        # wrapper allows in place) (gradc.passes.row_plan)
        self.rows: list = []
        self.inplace_pairs: tuple = ()      # this wrapper's, once rendered
        self.unused: set = set()            # upstreams of integer outputs, never read

    def render(self) -> str:
        g, cop, b = self.graph, self.cop, self.buf
        n_params = len(cop.params)
        params = g.params[:n_params]
        ups = g.params[n_params:] if self.method.name != "forward" else []
        for p in g.params:
            self.vars[p] = py_name(g.node(p).attr("name"))
        pos = [py_name(i.name) for i in cop.params if not i.has_default]
        pos += [self.vars[u] for u in ups]
        kw = [f"{py_name(i.name)}={py_literal(i.default)}" for i in cop.params if i.has_default]
        kw += ["seed=None"] if cop.draws else []
        args = ", ".join(pos + (["/"] if pos else []) + ["*"] + kw + ["out=None"]
                         + [f"{k}={v}" for k, v in self.extra_kw]
                         + (["_checked=None"] if self.row_plan else []))
        b.line(f"def {self.fn_name}({args}):")
        b.indent()
        names = [self.vars[p] for p in params]
        tup = ", ".join(names) + ("," if len(names) == 1 else "")
        b.line(f"_n = {cop.op.name + self.label + '.' + self.method.name!r}")
        check = f"({tup}), _T, _RT, _d = " + self.helper("inputs", f"_n, {self.sig}, ({tup})")
        if self.row_plan:
            b.line("if _checked is None:")
            b.line("    " + check)
            b.line("else:")
            b.line("    _T, _RT, _d = _checked")
        else:
            b.line(check)
        if cop.draws:
            b.line("_seed = _g_seed(_n, seed)")
        self._bind_sources()
        inputs = "(" + ", ".join(names + [self.vars[u] for u in ups]) + ("," if len(names + ups) == 1 else "") + ")"
        self.slots = self._buffer_slots()
        # Every argument is checked before any work, so a bad one leaves out= untouched.
        early = [self.shape_expr(s, early=True) for s in g.output_shapes]
        kinds = tuple("f" if g.node(o).dtype == FLOAT else g.node(o).dtype for o in g.outputs)
        labels = tuple(g.node(p).attr("name") for p in params + ups)
        inplace = self.inplace_pairs = self._inplace_pairs(params + ups)
        self.in_place = {k for k, _ in inplace}       # the outs that may be inputs
        self.arguments = inputs                         # the arrays out= may be
        b.line(f"_S = ({', '.join(early)}{',' if len(early) == 1 else ''})")
        # Upstreams converted first: out= is checked against the arrays the kernels read
        # (an object's __array__ may give other memory at a second call).
        if self.row_plan and ups:
            b.line("if _checked is None:")
            b.indent()
        self._check_upstreams(ups, {e: f"_S[{k}]" for k, e in reversed(list(enumerate(early)))})
        if self.row_plan and ups:
            b.dedent()
        b.line("_out = " + self.helper("out_tuple", f"_n, out, _S, {kinds!r}, {inputs}, {labels!r}"
                                      + (f", {inplace!r}" if inplace else "")))
        for variant, fn, pairs in self.rows:
            refused = tuple(pair for pair in inplace if pair not in pairs)
            self._row_dispatch(variant, fn, names, ups, refused, single=(
                self.method.name == "forward" and len(g.outputs) == 1))
        # NumPy's calls (the library steps: reductions of small arrays, the unfused
        # plans') warn of overflow and invalid values, where the kernels do not (nor do
        # JAX and PyTorch): silenced, so that a call warns or not whatever its size
        quiet = any(isinstance(step, LibraryCall) for step in self.plan.steps)
        if quiet:
            b.line('with np.errstate(all="ignore"):')
            b.indent()
        for k, step in enumerate(self.plan.steps):
            if isinstance(step, ReduceKernel):
                self._reduce_kernel(step, k)
            elif isinstance(step, Kernel):
                self._kernel(step, k)
            else:
                self._library(step)
        if quiet:
            b.dedent()
        results = ", ".join(self._value(o) for o in g.outputs) + ("," if len(g.outputs) == 1 else "")
        if self._input_free().issuperset(g.outputs):
            inputs = "()"           # no result can be (a view of) an argument: no check
        single = self.method.name == "forward" and len(g.outputs) == 1
        if self.host_fast_paths and inputs == "()" and self.fresh.issuperset(g.outputs) \
                and len(set(g.outputs)) == len(g.outputs):        # b = a: two arrays
            # the usual call: new arrays of the result dtype, what _g_finish would return
            b.line("if _out is None and _T is _RT.type:")
            b.line("    return " + (self._value(g.outputs[0]) if single else f"({results})"))
        b.line("_r = " + self.helper("finish", f"_n, _out, ({results}), _S, _RT, {inputs}"))
        b.line("return _r[0]" if single else "return _r")
        return b.getvalue()

    def _row_dispatch(self, variant, fn: str, names: list[str], ups: list[int], refused,
                      single: bool) -> None:
        """Run the row plan ``variant`` (wrapper ``fn``) when the arguments fit it: the
        full ones of one shape of a rank it serves, the columns of its last dim, the
        result dtype the compute dtype; an input j that out[k] is for a pair ``(k, j)``
        of ``refused`` (this method allows it in place, the row plan does not) is
        copied first (``rows_own``).  Arguments and out= buffers go as C-contiguous
        views with the leading dims collapsed; the results come back reshaped."""
        b, spec = self.buf, variant.cop.methods[self.method.name].graph
        dims = {row_plan.ROWS: "_R", row_plan.ROW: "_K"}

        def shape(s) -> str:
            ds = [str(dims.get(d, d)) for d in s.static]
            return "(" + ", ".join(ds) + ("," if len(ds) == 1 else "") + ")"

        forms = "".join(variant.forms)
        least = "" if self.rows_min is None else f", {self.rows_min}"
        b.line(f"_v = _g_row_shape(({', '.join(names)},), {forms!r}, "
               f"{variant.ranks[self.method.name]}{least})")
        b.line("if _v is not None and _T is _RT.type:")
        b.indent()
        if refused:
            every = ", ".join(names + [self.vars[u] for u in ups])
            lhs = every + ("," if len(names) + len(ups) == 1 else "")
            b.line(f"{lhs} = " + self.helper("rows_own", f"_out, ({every},), {refused!r}"))
        b.line("_R, _K = _v")
        args = []
        for k, (name, form) in enumerate(zip(names, variant.forms)):
            args.append(f"_g_reshaped({name}, (_R, _K))" if form == row_plan.FULL else name)
        ups_spec = spec.params[len(names):]
        for u, us in zip(ups, ups_spec):
            args.append(self.vars[u] if u in self.unused else   # 0.0: not read
                        f"_g_reshaped({self.vars[u]}, {shape(spec.node(us).shape)})")
        n_pos = sum(1 for p in self.cop.params if not p.has_default)
        kw = [f"{py_name(p.name)}={a}" for p, a in zip(self.cop.params, args[:len(names)])
              if p.has_default]
        args = [a for p, a in zip(self.cop.params, args) if not p.has_default] + args[len(names):]
        assert len(args) == n_pos + len(ups)
        outs = ", ".join(f"_g_reshaped(_out[{k}], {shape(s)})" for k, s in
                         enumerate(spec.output_shapes)) + ("," if len(spec.output_shapes) == 1
                                                           else "")
        outs = f"_GradcChecked(({outs}))"     # checked above: the row plan's check passes them
        # the arguments checked and converted above: the row plan's wrapper takes them so
        checked = "_checked=(_T, _RT, {**_d, " + f"{row_plan.ROWS!r}: _R, {row_plan.ROW!r}: _K}})"
        call = ", ".join(args + kw + [f"out=None if _out is None else {outs}"]
                         + [f"{k}={k}" for k, _ in self.extra_kw] + [checked])
        b.line(f"return _g_rows_back({fn}({call}), _S, _out, {single!r})")
        b.dedent()

    def _bind_sources(self) -> None:
        """The values of the source nodes of a draw: the call's seed, and the offset of
        the loop's first element among the draw's (0: loops over whole arrays)."""
        for node in self.graph:
            if node.op == "seed":
                self.vars[node.id] = "_seed"
            elif node.op == "draw_offset":
                self.vars[node.id] = "_G_NO_OFFSET"

    @staticmethod
    def lower_plan(plan: KernelPlan) -> KernelPlan:
        """The plan this backend runs: on the CPU, reductions fused into loops and
        cheap residuals recomputed (:func:`gradc.passes.fuse_reduce.cpu_plan`)."""
        return cpu_plan(plan)

    def helper(self, name: str, args: str) -> str:
        """A call of this backend's run-time helper ``name``."""
        extra = "".join(f", {k}={k}" for k, _ in self.extra_kw)
        return f"{self.prefix}{name}({args}{extra})"

    def _input_free(self) -> set[int]:
        """Values that cannot share memory with an argument: constants, kernel
        outputs (buffers of the call) and library results whose operands are such
        values (the library steps, CPU and CUDA, return new arrays or views of their
        operands; a shape-only operand gives only its shape)."""
        g = self.graph
        free = {node.id for node in g if node.op == "const"}
        for step in self.plan.steps:
            if isinstance(step, Kernel):
                free.update(step.outputs)
                free.update(getattr(step, "partials", ()))
                continue
            node = g.node(step.node)
            shape_only = PRIMITIVES[node.op].shape_only
            if all(a in free for i, a in enumerate(node.args) if i not in shape_only):
                free.add(step.node)
        return free

    def _buffer_slots(self) -> dict[int, int]:
        """Kernel outputs written straight into the caller's out[slot] (the others,
        library results and integer values, are copied there by ``_g_finish``): those
        of the steps from the last one that may raise on (see :func:`_may_raise`), so
        that a call refused by a later step has written nothing."""
        g, slots, steps = self.graph, {}, self.plan.steps
        last = max((k for k, step in enumerate(steps)
                    if _may_raise(step, g, g.output_shapes)), default=0)
        for step in steps[last:]:       # a reduce kernel's combined partials too
            for nid in step.outputs + getattr(step, "partials", ()) \
                    if isinstance(step, Kernel) else ():
                slot = next((i for i, o in enumerate(g.outputs) if o == nid), None)
                if slot is not None and g.node(nid).dtype == FLOAT and slot not in slots.values():
                    slots[nid] = slot
        return slots

    def _inplace_pairs(self, inputs: list[int]) -> tuple[tuple[int, int], ...]:
        """The ``(k, j)`` pairs for which out[k] may be input j's very array.

        A kernel out[k] is written by step s: every read of input j (or of a library
        result that may be a view of it) must come before s, or be s's own
        element-by-element read of input j itself (or of a result that is j's array
        where out[k] may be, ``Primitive.passes_operand``) before it writes that element (a
        reduce kernel's passes over a row: :func:`~gradc.passes.loop_ir.stores_after_reads`
        in every form of its loops the backend runs), and no result may be such a view.
        A reduce kernel's combined partial is written after its step s: every read
        must be at s or before.  An out[k] filled by ``_g_finish`` after all steps:
        no later result may be one.
        """
        g, steps = self.graph, self.plan.steps
        written = {}         # slot -> (step, written after the step's reads, the value)
        for s, step in enumerate(steps):
            if isinstance(step, Kernel):
                for after, values in ((False, step.outputs),
                                      (True, getattr(step, "partials", ()))):
                    for nid in values:
                        if (slot := self.slots.get(nid)) is not None:
                            written[slot] = (s, after, nid)
        pairs = []
        for j, p in enumerate(inputs):
            views, reads = {p}, []     # reads: (step, p itself read elementwise: its kernel)
            itself = {p}               # p's very array where out[k] may be (or a new one)
            for s, step in enumerate(steps):
                if isinstance(step, Kernel):
                    hit = views.intersection(step.inputs)
                    if hit:
                        reads.append((s, step if hit <= itself else None))
                    continue
                node = g.node(step.node)
                prim = PRIMITIVES[node.op]
                read = {a for i, a in enumerate(node.args) if i not in prim.shape_only}
                if value_used(g, step.node) and views & read:
                    reads.append((s, None))
                    if node.op != "matmul" and prim.kind != "reduction":
                        views.add(step.node)          # a view of p, perhaps
                    if prim.passes_operand is not None and \
                            node.args[prim.passes_operand] in itself:
                        itself.add(step.node)
            later = [k for k, o in enumerate(g.outputs) if o in views]
            for k in range(len(g.outputs)):
                if k not in written:
                    ok = all(pos <= k for pos in later)
                else:
                    s, after, nid = written[k]
                    ok = not later and all(
                        r < s or (r == s and (after or own is not None and
                                              self._stores_after_reads(own, p, nid, itself)))
                        for r, own in reads)
                if ok:
                    pairs.append((k, j))
        return tuple(pairs)

    def _stores_after_reads(self, step: Kernel, p: int, nid: int, arrays: set[int]) -> bool:
        """Whether kernel ``step`` reads input ``p`` (its array: the values ``arrays``)
        element by element before it stores its value ``nid`` there: an elementwise
        kernel where ``nid`` is computed from that element (the store waits for the
        load; else a threaded loop, whose arrays Numba marks as not overlapping, may
        store first: ``fwd_bwd(x, dy, out=(dy, x))`` of ``tanh`` wrote ``y`` over ``dy``
        before it read ``dy``, found by helper 61); a flat reduce kernel; a reduce
        kernel's passes over rows where :func:`~gradc.passes.loop_ir.stores_after_reads`
        says so, in every form of its loops this backend runs (:meth:`loop_forms`)."""
        if not isinstance(step, ReduceKernel):
            return self._computed_from(step, nid, arrays)
        if step.flat:
            return True
        slots = {i for i, (x, _) in enumerate(input_slots(self.graph, step)) if x == p}
        return all(stores_after_reads(loops, slots, nid) for loops in self.loop_forms(step))

    def _computed_from(self, step: Kernel, nid: int, arrays: set[int]) -> bool:
        """Whether kernel ``step``'s value ``nid`` is computed from one of its inputs
        ``arrays`` (or is one)."""
        todo, seen = [nid], set()
        while todo:
            n = todo.pop()
            if n in arrays:
                return True
            if n not in seen and n in step.nodes:
                seen.add(n)
                todo.extend(self.graph.node(n).args)
        return False

    def loop_forms(self, step: ReduceKernel) -> list:
        """The loop IRs of reduce kernel ``step`` this backend runs: on the CPU, its
        loops, and its online form where it has one (long rows)."""
        forms = [lower(self.graph, step, CPU)]
        if online(self.graph, step):
            forms.append(lower(self.graph, step, CPU, online=True))
        return forms

    def _check_upstreams(self, ups: list[int], known: dict[str, str]) -> None:
        """Cotangents (``vjp``, ``fwd_bwd``) or tangents (``jvp``) converted and
        checked against their output's or parameter's shape (``known``: the
        variables that hold some shape expressions' values already)."""
        kind = "tangent" if self.method.name == "jvp" else "upstream"
        outputs = self.cop.methods["forward"].graph
        dtypes = [outputs.node(o).dtype for o in outputs.outputs] if kind == "upstream" else []
        for k, u in enumerate(ups):
            name, label = self.vars[u], self.graph.node(u).attr("name")
            shape = self.shape_expr(self.graph.node(u).shape, early=True)
            if "(" in shape:                # computed (not an argument's .shape)
                shape = known.get(shape, shape)
            if k < len(dtypes) and dtypes[k] != FLOAT and not value_used(self.graph, u):
                # an integer output's (argmax's): nothing reads it, anything of its
                # shape is taken (JAX's float0, PyTorch's zeros of the index dtype, None)
                self.buf.line(f"{name} = _g_unused_upstream(_n, {label!r}, {name}, {shape})")
                self.unused.add(u)
                continue
            self.buf.line(f"{name} = " + self.helper(
                kind, f"_n, {label!r}, {name}, {shape}, _T"))

    def shape_expr(self, shape: Shape, early: bool = False) -> str:
        """A run-time expression of ``shape``: from the values computed so far, or
        (``early``) from the arguments alone, before any work."""
        static = "(" + "".join(f"{d!r}, " if isinstance(d, int) else f"_d[{d!r}], "
                               for d in shape.static) + ")"
        dyn = [self._early_shape(d) if early else f"{self.vars[d]}.shape"
               for d in sorted(shape.dyn)]
        if not dyn:
            return static
        if not shape.static and len(dyn) == 1:
            return dyn[0]
        labels = ([f"declared ({', '.join(map(str, shape.static))})"] if shape.static else []) + [
            self._label(d) for d in sorted(shape.dyn)]
        return (f"_g_bshape(_n, {tuple(labels)!r}, "
                f"{', '.join(([static] if shape.static else []) + dyn)})")

    def _early_shape(self, nid: int) -> str:
        """Node ``nid``'s run-time shape from the arguments' shapes (no data touched)."""
        node = self.graph.node(nid)
        if node.op == "param":
            return f"{self.vars[nid]}.shape"
        if nid not in node.shape.dyn:
            return self.shape_expr(node.shape, early=True)
        args = [self.shape_expr(self.graph.node(a).shape, early=True) for a in node.args]
        prim = PRIMITIVES[node.op]
        if prim.shape_like is not None:
            return args[prim.shape_like]
        if prim.np_shape is not None:
            return _shape_call(prim, node, args)
        raise CodegenError(f"no run-time shape rule for '{node.op}'", node.span)

    def _label(self, nid: int) -> str:
        """A value as error messages name it: a parameter's name, else its op and line."""
        node = self.graph.node(nid)
        if node.op == "param":
            return repr(node.attr("name"))
        return f"{node.op} (line {node.span.line})" if node.span else node.op

    def _kernel(self, step: Kernel, k: int) -> None:
        g, b = self.graph, self.buf
        comments = self._comments(step)
        if len(step.nodes) == 1 and step.nodes[0] not in g.outputs:
            base = f"_gu_{g.node(step.nodes[0]).op}"
        else:
            base = f"{self.kernel_base}_{k}"
        name = self.kernels.add(g, step, base, comments)
        b.line(self._shape_line(step))
        outs = self._output_arrays(step)
        rows = self.kernels.rows(g, step)
        ins = [f"{self.vars[i]}.ravel()" if self._whole_argument(step, i, rows) else
               self.helper("flat", f"{self.vars[i]}, " + (
                   "()" if is_scalar_input(g, i) else f"_s[{-rows[i]}:]" if i in rows else "_s"))
               for i in self._loop_inputs(step)]
        if not self.kernels.broadcast(g, step):
            b.line(self._launch(name, outs + ins, step))
            return
        # an input holding one row (a bias) read per row, not broadcast first
        arrays = [i for i in self._loop_inputs(step) if not is_scalar_input(g, i)]
        same = " == ".join(f"{self.vars[i]}.shape" for i in arrays)
        listed = "".join(f"{self.vars[i]}, " for i in arrays)
        b.line(f"_b = None if {same} else {self.helper('broadcast_rows', f'_s, ({listed})')}")
        b.line("if _b is None:")
        b.line("    " + self._launch(name, outs + ins, step))
        b.line("else:")
        rowwise = [f"_b[2][{arrays.index(i)}]" if i in arrays else a
                   for i, a in zip(self._loop_inputs(step), ins)]
        b.line("    " + self._launch(f"{name}_rows", outs + rowwise + ["_b[0]", "_b[1]"], step))

    def _whole_argument(self, step: Kernel, i: int, rows) -> bool:
        """Input ``i`` of ``step`` is an argument of the loop's own shape: as
        ``_g_inputs`` returns it (a C-contiguous array), ``.ravel()`` is the flat view
        ``_g_flat`` would give."""
        node = self.graph.node(i)
        return (self.host_fast_paths and node.op == "param" and i not in rows
                and not is_scalar_input(self.graph, i) and node.shape == step.shape)

    def _reduce_kernel(self, step: ReduceKernel, k: int) -> None:
        """A loop over rows with its reductions (:mod:`gradc.codegen.cpu_reduce`,
        :mod:`gradc.codegen.cuda_reduce`): ``_R`` rows of ``_N`` elements in ``_C``
        chunks (CUDA: blocks); chunk reductions are combined from their partials
        after it."""
        g, b = self.graph, self.buf
        name = self.kernels.add(g, step, f"{self.kernel_base}_{k}", self._comments(step))
        b.line(self._shape_line(step))
        lv = dict(step.levels)
        empty = next((_NUMPY_NAME[g.node(n).op] for n in step.nodes
                      if lv[n] == ROW and _no_identity(g.node(n))), None)
        kinds = dict(step.chunk_kind)
        b.line(f"{self.grid_names} = {self._rows_call(step, empty, step.cols)}")
        args = self._output_arrays(step, lambda nid: self.shape_expr(g.node(nid).shape)
                                   if lv[nid] == ROW else "_s")
        held = {}                       # partial -> the result buffer it gathers in
        for nid in step.partials:
            shape = "(_C, _N)" if kinds[nid] == "cols" else "(_C,)"
            held[nid] = self._gathered_into(step, nid)
            b.line(f"_p{nid} = {self._partials(shape, nid, gathered(g, step, nid), held[nid])}")
            args.append(self._partials_arg(f"_p{nid}"))
        for x, how in input_slots(g, step):
            shape = ("()" if how == SCALAR else self.shape_expr(g.node(x).shape)
                     if how in (PER_ROW, PER_COL) else "_s")
            args.append(self.helper("flat", f"{self._value(x)}, {shape}"))
        for line in self._reduce_launch(name, args, step):
            b.line(line)
        for nid in step.partials:
            node = g.node(nid)
            op = "sum" if node.op == "sum_to" else node.op
            count = "_R * _N" if kinds[nid] == "all" and lv.get(node.args[0]) != ROW and \
                g.node(node.args[0]).shape == step.shape else "_R"
            self.vars[nid] = f"_v{nid}"
            initial = ", empty_ok=True" if node.op in ("max", "min") and \
                not _no_identity(node) else ""      # an empty max is its initial value
            shape = self.shape_expr(node.shape)
            if (slot := self.slots.get(nid)) is not None:     # straight into out[slot]
                # without out=, a sum of one chunk gathered straight is its partial's row
                own = "None" if op == "sum" and gathered(g, step, nid) else None
                initial += f", into={held[nid] or self._result_buffer(slot, shape, own)}"
                self.fresh.add(nid)
            b.line(f"_v{nid} = " + self.helper("combine", f"_n, {op!r}, _p{nid}, {count}, "
                                               f"{shape}, _T{initial}"))

    grid_names = "_R, _N, _C, _SG"          # what _rows_call gives

    def _rows_call(self, step: ReduceKernel, empty: str | None, cols: bool) -> str:
        """The call giving a reduce kernel's ``_R, _N, _C, _SG`` from its loop's shape
        ``_s``; ``empty``: the NumPy name of a reduction that refuses empty rows, or
        None; a kernel that splits rows gets segments ``_SG`` for few long rows."""
        split = splits(self.graph, step)
        return (f"_g_rows(_n, _s, {step.split}, {empty!r}{', cols=True' if cols else ''}"
                f"{', split=_G_SPLIT' if split else ''}"
                f"{', cols_split=_G_SPLIT_COLS' if split and cols else ''})")

    def _partials(self, shape: str, nid: int, gathered: bool, into: str | None = None) -> str:
        """A new float64 array of ``shape`` for the partials of reduction ``nid``; of
        the compute dtype where the kernel ``gathered`` them (a sum across rows) and no
        chunk has more rows than it gathers (:func:`~gradc.passes.loop_ir.gathered`);
        ``into``: the result's buffer, which the one chunk of few long rows gathers in
        unless it is an argument's array (``_g_partial_rows``)."""
        straight = f"_g_gathers_straight(_R, _C, {GATHER_ROWS})"
        if into is not None:
            inputs = self.arguments if self.slots[nid] in self.in_place else "()"
            return self.helper("partial_rows", f"{into}, _C, _N, _T, {straight}, {inputs}")
        if gathered:
            return self._empty(f"_T if {straight} else np.float64", shape)
        return self._empty("np.float64", shape)

    def _gathered_into(self, step: ReduceKernel, nid: int) -> str | None:
        """A sum across rows the CPU kernel gathers straight, of a result the caller may
        pass in out=: the variable of the result's buffer (printed here, before the
        kernel, which may gather in it), else None."""
        g = self.graph
        slot = self.slots.get(nid)
        if slot is None or g.node(nid).op == "mean" or not gathered(g, step, nid):
            return None
        shape = self.shape_expr(g.node(nid).shape)
        self.buf.line(f"_b{nid} = {self._result_buffer(slot, shape, 'None')}")
        return f"_b{nid}"

    def _partials_arg(self, var: str) -> str:
        """A reduce kernel's partials array ``var`` as the kernel takes it."""
        return var

    def _reduce_launch(self, name: str, args: list[str], step: ReduceKernel) -> list[str]:
        """The lines that call reduce kernel ``name`` of ``step`` on its arrays ``args``
        (``_ka``): its split rows where ``_SG`` segments
        (:func:`~gradc.passes.loop_ir.splits`), their segments in parallel as its other
        loops are; rows of a length of :func:`~gradc.passes.loop_ir.static_rows`,
        ``name_n<length>``; its online form ``name_online`` (whole or split) on rows of
        ``_G_ONLINE[0]`` bytes or more, ``_G_ONLINE[1]`` where that form computes an exp
        again (:func:`~gradc.passes.loop_ir.online`,
        :func:`~gradc.passes.loop_ir.online_again`); else ``name``.  Each threaded from
        ``_G_PARALLEL_MIN`` elements, else its chunks in turn (``_chunks``)."""
        lines = [f"_ka = ({', '.join(args + ['_R', '_N', '_C'])})"]
        if not self.after_blas:
            lines.append("_par = _R * _N >= _G_PARALLEL_MIN")

        def rows(kernel: str) -> str:
            serial = f"{kernel}_chunks(*_ka, 0, _C, _G_WITNESS[_T])"    # every chunk, in turn
            return serial if self.after_blas else \
                f"{kernel}(*_ka, _G_WITNESS[_T]) if _par else {serial}"
        forms = []                                      # (condition, call), first match
        if splits(self.graph, step):
            split = f"{name}_split"
            if online(self.graph, step):
                split = f"({name}_online_split if {self._online_rows(step)} else {split})"
            par = "False" if self.after_blas else "_par"
            forms.append(("_SG", f"{split}(*_ka, _SG, {par}, _G_WITNESS[_T])"))
        forms += [(f"_N == {k}", rows(f"{name}_n{k}")) for k in static_rows(step)]
        if online(self.graph, step):
            forms.append((self._online_rows(step), rows(f"{name}_online")))
        if not forms:
            return lines + [rows(name)]
        for k, (condition, call) in enumerate(forms):
            lines += [f"{'elif' if k else 'if'} {condition}:", f"    {call}"]
        return lines + ["else:", f"    {rows(name)}"]

    def _online_rows(self, step: ReduceKernel) -> str:
        """Whether the rows are long enough for ``step``'s online form."""
        again = int(online_again(self.graph, step))
        return f"_N * _G_WITNESS[_T].itemsize >= _G_ONLINE[{again}]"

    def _output_arrays(self, step: Kernel, shape_of=lambda nid: "_s") -> list[str]:
        """Arrays for the values ``step`` stores (the caller's out[k] where it is a
        result, else new), as the flat views the kernel takes; ``shape_of`` gives
        a value's shape expression (the loop's ``_s`` unless it is a row value)."""
        g, arrays = self.graph, []
        for nid in step.outputs:
            var = f"_v{nid}"
            self.vars[nid] = var
            shape, slot = shape_of(nid), self.slots.get(nid)
            if slot is not None:
                self.buf.line(f"{var} = {self._result_buffer(slot, shape)}")
                if shape != "_s" or step.shape == g.node(nid).shape:
                    self.fresh.add(nid)
            else:
                self.buf.line(f"{var} = {self._empty(OUT_DTYPE[g.node(nid).dtype], shape)}")
            arrays.append(f"{var}.reshape(-1)")
        return arrays

    def _result_buffer(self, slot: int, shape: str, own: str | None = None) -> str:
        """Where a result computed in place goes: the caller's out[slot] when it can
        hold it (``_g_buffer``), else a new array of ``shape`` (``own``: what the call
        gives without out=, instead of a new array)."""
        buffer = self.helper("buffer", f"_n, _out, {slot}, {shape}, _T, _RT")
        if self.host_fast_paths:          # no out=: what _g_buffer would make
            buffer = f"{own or f'np.empty({shape}, dtype=_T)'} if _out is None else {buffer}"
        return buffer

    def _comments(self, step: Kernel) -> tuple[str, str]:
        g = self.graph
        spans = sorted({(g.node(n).span.file, g.node(n).span.line)
                        for n in step.nodes if g.node(n).span})
        where = ", ".join(f"{Path(f).name}:{l}" for f, l in spans) or "generated"
        ops = " ".join(g.node(n).op for n in step.nodes)
        return (f"{self.cop.op.name}.{self.method.name}: {ops}", f"from {where}")

    def _shape_line(self, step: Kernel) -> str:
        """``_s = `` the run-time shape of ``step``'s loop."""
        return f"_s = {self.shape_expr(step.shape)}"

    def _loop_inputs(self, step: Kernel) -> tuple[int, ...]:
        """The inputs ``step``'s kernel reads element by element (flattened)."""
        return step.inputs

    def _empty(self, dtype: str, shape: str = "_s") -> str:
        """A new array for an intermediate (of the kernel's shape ``_s`` by default)."""
        return f"np.empty({shape}, dtype={dtype})"

    def _launch(self, name: str, args: list[str], step: Kernel) -> str:
        first, args = args[0], ", ".join(args + ["_G_WITNESS[_T]"])
        if self.after_blas:         # BLAS's threads still spin: one thread, no waiting
            return f"{name}_serial({args})"
        # threaded from _G_PARALLEL_MIN elements (the first output's, as reduce kernels)
        assert first.endswith(".reshape(-1)"), first
        size = first.removesuffix(".reshape(-1)") + ".size"
        return f"({name} if {size} >= _G_PARALLEL_MIN else {name}_serial)({args})"

    def _library(self, step: LibraryCall) -> None:
        node = self.graph.node(step.node)
        prim = PRIMITIVES[node.op]
        fields = {p: self._value(a) if a in self.vars or i not in prim.shape_only
                  else self._shape_stand_in(a)
                  for i, (p, a) in enumerate(zip(prim.params, node.args))}
        text = self._library_text(node, fields)
        if not value_used(self.graph, step.node):
            text = self._shape_only(node, list(fields.values()))
        var = f"_v{step.node}"
        self.vars[step.node] = var
        self.buf.line(f"{var} = {text}")
        # After a matmul, BLAS's worker threads spin on the cores for a while (OpenBLAS
        # ~0.1 s, MKL's OpenMP 0.2 s): a threaded loop then waits for a core each time
        # (2-5x slower here than on one thread), so later loops run on this thread.
        self.after_blas |= node.op == "matmul" and value_used(self.graph, step.node)

    def _library_text(self, node, fields: dict[str, str]) -> str:
        """The expression computing library step ``node`` from its operands."""
        text = PRIMITIVES[node.op].lib.format(**self._attrs(node), **fields)
        if node.attr("initial") is not None:          # np.max(..., initial=-np.inf)
            text = f"{text[:-1]}, initial={_float_literal(node.attr('initial'))})"
        return text

    def _shape_only(self, node, args: list[str]) -> str:
        """A value kept only as a run-time shape source: a view of one zero, no work."""
        prim = PRIMITIVES[node.op]
        if prim.shape_like is None and prim.np_shape is None:
            raise CodegenError(f"no run-time shape rule for '{node.op}'", node.span)
        shape = (f"np.shape({args[prim.shape_like]})" if prim.shape_like is not None else
                 _shape_call(prim, node, [f"np.shape({a})" for a in args]))
        return f"np.broadcast_to(np.zeros((), _T), {shape})  # only its shape is used"

    @staticmethod
    def _attrs(node) -> dict:
        """The attributes of ``node`` its primitive's templates and lowerings take."""
        return {k: node.attr(k) for k in PRIMITIVES[node.op].attr_names}

    def _shape_stand_in(self, nid: int) -> str:
        """An array of ``nid``'s shape, for an operand read only for its shape and
        not computed (yet): a view of one zero, its shape from the arguments."""
        shape = self.shape_expr(self.graph.node(nid).shape, early=True)
        return f"np.broadcast_to(np.zeros((), _T), {shape})"

    def _value(self, nid: int) -> str:
        node = self.graph.node(nid)
        if node.op == "const":
            return f"np.asarray({py_literal(node.value)}, dtype={OUT_DTYPE[node.dtype]})"
        return self.vars[nid]


def _may_raise(step, graph: Graph, checked: list[Shape]) -> bool:
    """Whether ``step`` may refuse a call whose arguments passed the checks before any
    work: a library call whose primitive may (``Primitive.may_refuse``), a reduce kernel (an
    empty row, its partials), a matmul with its epilogue, a kernel whose loop
    broadcasts run-time shapes (``_g_bshape``) other than the results' shapes
    (``checked``: broadcast before any work, ``_S``)."""
    if isinstance(step, LibraryCall):
        return PRIMITIVES[graph.node(step.node).op].may_refuse
    if isinstance(step, (ReduceKernel, MatmulEpilogue)):
        return True
    shape = step.shape
    return bool(shape.dyn) and (bool(shape.static) or len(shape.dyn) > 1) \
        and shape not in checked


# The NumPy ufunc whose reduction a max or min is (its name in NumPy's empty-slice error).
_NUMPY_NAME = {"max": "maximum", "min": "minimum"}


def _no_identity(node) -> bool:
    """A max or min reduction that raises for an empty slice, as NumPy's does (one
    with an ``initial`` value, such as logsumexp's decomposition (:func:`~gradc.passes.simplify.expand_decompositions`),
    gives it there)."""
    return node.op in ("max", "min") and node.attr("initial") is None


def _float_literal(v: float) -> str:
    return "np.inf" if v == float("inf") else "-np.inf" if v == float("-inf") else repr(v)


def _shape_call(prim, node, shapes: list[str]) -> str:
    """The call of ``prim``'s NumPy shape function on run-time ``shapes``."""
    kw = [f"{k}={node.attr(k)!r}" for k in prim.attr_names]
    return f"{prim.np_shape.__name__}({', '.join([*shapes, *kw])})"
