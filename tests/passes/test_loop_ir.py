"""The loop IR of reduce kernels (gradc.passes.loop_ir): the decisions lower() makes once
for the printers, read on softmax's fused fwd_bwd (the kernel of
tests/codegen/test_reduce_kernels.py's prefetch test, tests/row_sources.py)."""
from __future__ import annotations

import pytest

from gradc.frontend.check import check_source
from gradc.passes.fuse_reduce import ReduceKernel, cpu_plan
from gradc.passes.loop_ir import (BLOCK, CPU, CUDA, PREFETCH_AHEAD, ROW_GROUP, Acc, Buffer,
                                  Centre, Finish, LoadBack, Online, Pass, Prefetch, Shift, Stage,
                                  STATIC_ROWS, Store, Tree, Update, deferred, hosted, lower,
                                  online, online_again, static_rows)
from gradc.passes.row_schedule import Schedule, centred_sums, online_sums
from gradc.pipeline import build_op
from row_sources import LAYER_NORM_ROWS, SOFTMAX_ROWS



def fwd_bwd_kernel(text: str, op: str, method: str = "fwd_bwd"):
    program = check_source(text, f"{op}.grad")
    cop = build_op(program.ops[op], program.ops, program.consts)
    plan = cpu_plan(cop.methods[method].fused)
    (kernel,) = [s for s in plan.steps if isinstance(s, ReduceKernel)]
    return plan.graph, kernel


@pytest.fixture(scope="module")
def softmax():
    return fwd_bwd_kernel(SOFTMAX_ROWS, "softmax")


@pytest.fixture(scope="module")
def layer_norm():
    return fwd_bwd_kernel(LAYER_NORM_ROWS, "layer_norm")


def test_cpu_softmax_fwd_bwd_runs_the_exp_pass_in_blocks_with_the_next_rows_hints(softmax):
    graph, kernel = softmax
    loops = lower(graph, kernel, CPU)
    assert len(loops.passes) == 4           # max; exp and its sum; y and y.dy; dx
    y, dx = loops.outputs
    x_slot, dy_slot = [j for j, (v, a) in enumerate(loops.slots) if a == "element"]
    # the passes with sums run in blocks (the exp's sum, the dot of y and dy)
    assert [ps.block for ps in loops.passes] == [0, BLOCK, BLOCK, 0]
    # a row of at most a block runs them as one loop (the loop nest cost rows of 64)
    assert [ps.whole for ps in loops.passes] == [False, True, True, False]
    exp_pass = loops.passes[1]
    assert [graph.node(acc.node).op for acc, _ in exp_pass.block_sums] == ["sum"]
    # the exp pass reads nothing new from memory: it prefetches x and dy, and y and dx
    # for writing
    assert exp_pass.prefetch == Prefetch((x_slot, dy_slot), (y, dx))
    assert [p for p, ps in enumerate(loops.passes) if ps.prefetch] == [1]
    assert loops.prefetch_rows
    # exp is kept in a row of scratch and stored by the exp pass
    assert [graph.node(n).op for n in loops.scratch] == ["exp"]
    assert Store(loops.scratch[0], Buffer("scratch", loops.scratch[0])) in exp_pass.body
    # the third pass sums y * dy in its own loop: it keeps y in the exp's scratch row,
    # over the exp it has read (deferred); the last reads y from there and stores y and
    # dx, so that no pass with a sum stores to an output (nothing staged)
    k = Buffer("scratch", loops.scratch[0])
    third, last = loops.passes[2].body, loops.passes[-1].body
    assert LoadBack(loops.scratch[0], k) in third and third[-1] == Store(y, k)
    assert not any(isinstance(s, Store) and s.buffer.kind == "output" for s in third)
    assert LoadBack(y, k) in last and LoadBack(y, Buffer("output", y)) not in last
    # y's own row hosts the scratch row where the call allows (hosted): the last pass's
    # store of y is skipped there, the row holds y already
    assert loops.hosts == {loops.scratch[0]: y}
    assert last[-2:] == [Store(dx, Buffer("output", dx)),
                         Store(y, Buffer("output", y), hosted=True)]
    assert not any(ps.staged for ps in loops.passes) and loops.stages == []
    # the row max keeps its NaN in a flag (the compute dtype, vectorised)
    (first,) = [s for s in loops.passes[0].body if isinstance(s, Update)]
    assert first.kind == "max" and first.nan_flag


def test_an_output_stored_by_a_pass_with_sums_is_deferred_only_into_a_free_scratch_row():
    # passes by hand: value 1 in scratch, read back by pass 1, which computes output 5
    # and sums it (reassoc); pass 2 reads 5 back
    k, y = Buffer("scratch", 1), Buffer("output", 5)
    total = Update(9, "sum", 0, Acc("s", 9))

    def passes(third: list) -> list[Pass]:
        return [Pass(body=[Store(1, k)]),
                Pass(body=[LoadBack(1, k), total, Store(5, y)]),
                Pass(body=third)]

    ps = passes([LoadBack(5, y), Store(7, Buffer("output", 7))])
    deferred(Schedule(passes=3, scratch=[1]), ps)
    assert ps[1].body == [LoadBack(1, k), total, Store(5, k)]
    assert ps[2].body == [LoadBack(5, k), Store(7, Buffer("output", 7)), Store(5, y)]
    kept = [[LoadBack(5, y)],
            [LoadBack(5, y), LoadBack(1, k)],           # the scratch row's value read later
            [LoadBack(5, y), Update(8, "sum", 0, Acc("s", 8))],     # the later pass sums
            [Store(7, Buffer("output", 7))]]            # nothing reads 5 back
    schedules = [Schedule(passes=3), Schedule(passes=3, scratch=[1]),
                 Schedule(passes=3, scratch=[1]), Schedule(passes=3, scratch=[1])]
    for third, sch in zip(kept, schedules):
        ps = passes(list(third))
        deferred(sch, ps)
        assert ps[1].body[-1] == Store(5, y) and ps[2].body == third
    # a max (a NaN flag, not reassociated) is no sum that would be staged
    ps = passes([LoadBack(5, y)])
    ps[1].body[1] = Update(9, "max", 0, Acc("s", 9), nan_flag=True)
    deferred(Schedule(passes=3, scratch=[1]), ps)
    assert ps[1].body[-1] == Store(5, y)


def test_an_output_hosts_a_scratch_row_only_where_no_earlier_pass_uses_it():
    # value 1 in scratch row k from pass 0, read by pass 1 and pass 2; outputs 5 and 7
    k, y, z = Buffer("scratch", 1), Buffer("output", 5), Buffer("output", 7)

    def passes(second: list, third: list) -> list[Pass]:
        return [Pass(body=[Store(1, k)]), Pass(body=[LoadBack(1, k), *second]),
                Pass(body=[LoadBack(1, k), *third])]

    # 5 is stored by the last pass that uses k: it hosts k, stored through k there (after
    # the row's value is read) and to its output unless the call lets it host
    ps = passes([], [Store(5, y)])
    assert hosted([1], [5, 7], ps) == {1: 5}
    assert ps[2].body == [LoadBack(1, k), Store(5, k), Store(5, y, hosted=True)]
    # stored before k's last use (the row would be overwritten): not 5, but 7
    ps = passes([Store(5, y)], [Store(7, z)])
    assert hosted([1], [5, 7], ps) == {1: 7}
    assert ps[1].body == [LoadBack(1, k), Store(5, y)]
    # a value k holds already (deferred there) is not stored through it again
    ps = passes([Store(5, k)], [LoadBack(5, k), Store(5, y)])
    assert hosted([1], [7, 5], ps) == {1: 5}
    assert ps[2].body == [LoadBack(1, k), LoadBack(5, k), Store(5, y, hosted=True)]
    # a last pass with a sum in LLVM's order keeps its stores: a skipped store would
    # make it two loops, whose sums might differ; nor does a row read back early host
    total = Update(9, "sum", 0, Acc("s", 9))
    for second, third in (([], [total, Store(5, y)]), ([LoadBack(5, y)], [Store(5, y)])):
        ps = passes(list(second), list(third))
        assert hosted([1], [5], ps) == {} and ps[2].body == [LoadBack(1, k), *third]
    # an output written only after the row's last use hosts it as it is
    ps = passes([], [])
    ps.append(Pass(body=[Store(5, y)]))
    assert hosted([1], [5], ps) == {1: 5} and ps[3].body == [Store(5, y)]


def test_cuda_softmax_fwd_bwd_has_no_scratch_blocks_or_hints_and_finishes_in_trees(softmax):
    graph, kernel = softmax
    loops = lower(graph, kernel, CUDA)
    assert len(loops.passes) == 4
    assert loops.scratch == [] and not loops.prefetch_rows
    assert all(not ps.block and not ps.block_sums and ps.prefetch is None for ps in loops.passes)
    # the max, the sum and the dot finish in block trees before the passes that use them
    assert [sum(isinstance(s, Tree) for s in ps.before) for ps in loops.passes] == [0, 1, 1, 1]
    y, dx = loops.outputs
    assert LoadBack(y, Buffer("output", y)) in loops.passes[-1].body
    assert not any(isinstance(s, Update) and s.nan_flag for ps in loops.passes for s in ps.body)


def test_cpu_layer_norm_fwd_bwd_takes_its_centred_sums_in_the_statistics_pass(layer_norm):
    graph, kernel = layer_norm
    cen = centred_sums(graph, kernel)
    # the variance mean(xc^2) and the backward's mean(g * xhat) = rstd * mean(g * xc)
    assert sorted(len({v for v, _ in c.values}) for c in cen.values()) == [1, 2]
    (cov,) = [c for c in cen.values() if c.factors]
    assert [graph.node(f).op for f in cov.factors] == ["rsqrt"]
    loops = lower(graph, kernel, CPU)
    assert len(loops.passes) == 2           # statistics; y, dx, dw and db
    first, last = loops.passes
    assert {c.node for c in first.centred} == set(cen) and not last.centred
    # x is staged once for both, and summed once (mean(x)'s sums serve); g too
    assert len([s for s in first.body if isinstance(s, Stage)]) == 2
    var = next(c for c in first.centred if not cen[c.node].factors)
    assert var.buffers == (var.buffers[0],) and var.sums[0] in first.block_sums
    # in blocks, x is read again from its input row (the pass stores no output), not
    # staged; g = dy * w, computed, is staged in blocks too
    (x_slot,) = [j for j, (x, _) in enumerate(loops.slots) if dict(graph.node(x).attrs) == {
        "name": "x"}]
    moment = next(c for c in first.centred if cen[c.node].factors)
    assert var.slots == (x_slot,) and set(moment.slots) == {None, x_slot}
    assert sorted(s.blocks for s in first.body if isinstance(s, Stage)) == [False, True]
    # the statistics pass prefetches: its centred loop reads only the block; it streams
    # its own row, so it reads its inputs a distance ahead, in every row
    assert first.prefetch is not None and last.prefetch is None
    assert first.prefetch == Prefetch(first.prefetch.reads, (), PREFETCH_AHEAD)
    assert len(first.prefetch.reads) == 2 and not loops.prefetch_rows
    finishes = [s for s in first.before + last.before if isinstance(s, Finish) and s.centred]
    assert {f.node for f in finishes} == set(cen)
    # CUDA keeps the variance after the mean, and mean(g * xhat) after both: four passes
    cuda = lower(graph, kernel, CUDA)
    assert len(cuda.passes) == 4 and not cuda.centred
    assert not any(isinstance(s, (Stage, Centre)) for ps in cuda.passes for s in ps.body)


def test_a_centred_pass_that_stores_outputs_stages_its_inputs_in_blocks_too():
    # dz = 2 z dy is stored in the variance's pass: written in place of x, x's row would
    # hold it by the centred loop, so x is read from its stage row there
    graph, kernel = fwd_bwd_kernel("""
op vz(x: f32[n, k], z: f32[n, k]) -> y {
    y = mean((x - mean(x, axis=-1, keepdims=true))^2, axis=-1) + sum(z * z, axis=-1)
}""", "vz")
    first = lower(graph, kernel, CPU).passes[0]
    assert any(isinstance(s, Store) for s in first.body)
    assert [c.slots for c in first.centred] == [(None,)]
    assert all(s.blocks for s in first.body if isinstance(s, Stage))


def test_cpu_softmax_fwd_bwd_online_form_sums_the_exp_in_the_pass_of_the_max(softmax):
    graph, kernel = softmax
    sums = online_sums(graph, kernel)
    o = next(o for o in sums.values() if o.weight is None)
    assert graph.node(o.max).op == "max" and o.shift == (o.max,)   # exp(x - max(x))
    # sum(y * dy), y = e / sum(e): a sum of e * dy divided by the sum of e
    (w,) = [w for w in sums.values() if w.weight is not None]
    assert (w.max, w.shift, w.exp, w.divisors) == (o.max, o.shift, o.exp, (o.node,))
    assert not w.negated and w.factors == ()
    assert online(graph, kernel)
    loops = lower(graph, kernel, CPU, online=True)
    assert loops.online and loops.split       # its split rows too
    assert len(loops.passes) == 2           # max, sum and sum of e * dy online; y and dx
    first = loops.passes[0]
    x_slot, dy_slot = [j for j, (v, a) in enumerate(loops.slots) if a == "element"]
    assert first.online == [Online(o.node, Acc("s", o.max), slot=x_slot),
                            Online(w.node, Acc("s", o.max), slot=x_slot, weight=dy_slot)]
    assert first.block == BLOCK
    # the exp is computed again in the pass of y, not kept in scratch
    assert loops.scratch == []
    finishes = {s.node: s for s in loops.passes[1].before if isinstance(s, Finish)}
    assert finishes[o.node].shift == finishes[w.node].shift == (o.max,)
    assert finishes[w.node].divisors == (o.node,) and finishes[o.node].divisors == ()
    # CUDA and the other CPU form keep the max and the sums in passes of their own
    assert len(lower(graph, kernel, CUDA, online=True).passes) == 4
    assert not lower(graph, kernel, CPU).online
    # it computes the exp again (the other form keeps it in scratch), but reads the row
    # two passes fewer with four arrays: it runs from ONLINE_ROWS
    assert not online_again(graph, kernel)
    graph, vjp = fwd_bwd_kernel(SOFTMAX_ROWS, "softmax", "vjp")
    assert online(graph, vjp) and online_again(graph, vjp)      # three arrays


@pytest.mark.parametrize("grad, weighted", [
    ("y * (dy - sum(y * dy, axis=1, keepdims=true))", True),
    ("y * (dy - sum(dy * y, axis=1, keepdims=true))", True),
    ("y * (dy - sum(e * dy, axis=1, keepdims=true))", True),        # no divisor
    ("y * (dy - mean(y * dy, axis=1, keepdims=true))", True),
    ("y * (dy - sum(y * x, axis=1, keepdims=true))", True),         # the input itself
    ("y * (dy - sum(-(y * dy), axis=1, keepdims=true))", True),     # negated
    # times and over other row values (a plain sum in the pass of the max)
    ("y * (dy - sum(e / sum(x, axis=1, keepdims=true) * dy, axis=1, keepdims=true))", True),
    ("y * (dy - sum(-dy * e * sum(x, axis=1, keepdims=true) / sum(e, axis=1, keepdims=true)"
     " / sum(e, axis=1, keepdims=true), axis=1, keepdims=true))", True),
    # weighted by a row value only, or by a value computed in the kernel, or two exps
    ("y * (dy - sum(y * max(dy, axis=1, keepdims=true), axis=1, keepdims=true))", False),
    ("y * (dy - sum(y * (dy * dy), axis=1, keepdims=true))", False),
    ("y * (dy - sum(y * e * dy, axis=1, keepdims=true))", False),
])
def test_weighted_online_sums_are_exp_times_an_input_over_its_own_sum(grad, weighted):
    """A row sum of exp(x - max) times an input read per element, negated or not, times
    and over row values (the plain online sum of that exp, another sum), is a weighted
    online sum; not one weighted by a row value alone, nor by an element value computed
    in the kernel, nor of two exps."""
    graph, kernel = fwd_bwd_kernel(f"""op f(x: f32[b, n]) -> y {{
    e = exp(x - max(x, axis=1, keepdims=true))
    y = e / sum(e, axis=1, keepdims=true)
}} grad(dy) -> dx {{
    dx = {grad}
}}""", "f", "vjp")
    found = [o for o in online_sums(graph, kernel).values() if o.weight is not None]
    assert bool(found) == weighted
    if weighted:
        assert len(lower(graph, kernel, CPU, online=True).passes) == 2


def test_cpu_row_kernels_have_static_lengths_flat_ones_and_other_forms_none(softmax):
    """The CPU form of a kernel over rows runs compiled in for the lengths of
    STATIC_ROWS; its online form, CUDA's and a flat kernel's (a sum of all elements)
    for none."""
    graph, kernel = softmax
    assert static_rows(kernel) == STATIC_ROWS and 64 in STATIC_ROWS and 32 not in STATIC_ROWS
    assert lower(graph, kernel, CPU).static == STATIC_ROWS
    assert lower(graph, kernel, CPU, online=True).static == ()
    assert lower(graph, kernel, CUDA).static == ()
    graph, flat = fwd_bwd_kernel("""op sumsq(x: f32[r, n]) -> y {
    y = sum(x * x)
}""", "sumsq", "forward")
    assert flat.flat and static_rows(flat) == () and lower(graph, flat, CPU).static == ()


@pytest.mark.parametrize("dims, axis, lengths", [
    ("r, 64", "-1", (64,)), ("r, 2, 64", "(1, 2)", (128,)), ("r, 100", "-1", ()),
    ("r, n", "-1", STATIC_ROWS)])
def test_rows_of_declared_dims_have_only_their_own_static_length(dims, axis, lengths):
    """Rows of declared dims have one length: entries for that length where it is one
    of STATIC_ROWS, none for the others (they would never run)."""
    graph, kernel = fwd_bwd_kernel(f"""op lsm(x: f32[{dims}]) -> y {{
    y = x - logsumexp(x, axis={axis}, keepdims=true)
}}""", "lsm", "forward")
    assert not kernel.flat and static_rows(kernel) == lengths


def test_a_logsumexp_online_computes_no_exp_again() -> None:
    """A logsumexp's online form sums each exp once, as the other form does: it runs
    from ONLINE_ROWS on every CPU (loop_ir.online_again, ONLINE_AGAIN)."""
    graph, kernel = fwd_bwd_kernel("""op lse(x: f32[r, n]) -> y {
    y = logsumexp(x, axis=1)
}""", "lse", "forward")
    assert online(graph, kernel) and not online_again(graph, kernel)


@pytest.mark.parametrize("body, found", [
    ("y = x * sum(exp(x - max(x, axis=1, keepdims=true)), axis=1, keepdims=true)", True),
    # the max of an element value: the sum reads it from the max's stage row
    ("z = 2 * x\n    y = x * sum(exp(z - max(z, axis=1, keepdims=true)), axis=1, keepdims=true)",
     True),
    # shifted by a value of the max and a constant
    ("y = x * sum(exp(x - (max(x, axis=1, keepdims=true) + 2)), axis=1, keepdims=true)", True),
    # shifted by another reduction, by the max of another value, or not an exp
    ("y = x * sum(exp(x - mean(x, axis=1, keepdims=true)), axis=1, keepdims=true)", False),
    ("y = x * sum(exp(x - max(x * x, axis=1, keepdims=true)), axis=1, keepdims=true)", False),
    ("y = x * sum(exp(x - max(x, axis=1, keepdims=true) - mean(x, axis=1, keepdims=true)), "
     "axis=1, keepdims=true)", False),
    ("y = x * sum(sin(x - max(x, axis=1, keepdims=true)), axis=1, keepdims=true)", False),
    # shifted by a value that can be -inf where the max is not (helper 44)
    ("m = max(x, axis=1, keepdims=true)\n    y = x * sum(exp(x - where(m > 0, m, -inf)), axis=1,"
     " keepdims=true)", False),
    ("m = max(x, axis=1, keepdims=true)\n    y = x * sum(exp(x - (m - 1e39)), axis=1,"
     " keepdims=true)", False),
    # a logsumexp: its max and its sum (log_softmax's forward: 3 passes, 2 online)
    ("y = x - logsumexp(x, axis=1, keepdims=true)", True),
])
def test_online_sums_are_sums_of_exp_shifted_by_the_max(body, found):
    graph, kernel = fwd_bwd_kernel(f"op f(x: f32[b, n]) -> y {{\n    {body}\n}}\n", "f",
                                   "forward")
    sums = online_sums(graph, kernel)
    assert bool(sums) == found
    assert online(graph, kernel) == found
    if found:
        assert len(lower(graph, kernel, CPU, online=True).passes) == \
            len(lower(graph, kernel, CPU).passes) - 1


@pytest.mark.parametrize("body, passes", [
    ("y = log_softmax(x, axis=1)", 2),
    ("y = logsumexp(x - max(x, axis=1, keepdims=true), axis=1)", 1),
    ("y = x - logsumexp(x - (max(x, axis=1, keepdims=true) + 2), axis=1, keepdims=true)", 2),
    # a shift that may be -inf where the max is not: the logsumexp's own max (found by
    # helper 44: -inf less -inf is NaN, which the online form of x cannot see)
    ("m = max(x, axis=1, keepdims=true)\n    y = logsumexp(x - where(m > 0, m, -inf), axis=1)",
     None),
])
def test_a_logsumexp_of_x_less_a_shift_of_its_max_runs_online_in_the_pass_of_the_max(
        body, passes):
    """The built-in log_softmax's logsumexp(x - max(x)) (jax.nn's form) and its like: an
    online sum of x itself with the max's accumulator, shifted as written, so that the
    max of x - max(x) and its sum take no passes of their own (log_softmax's forward:
    2 passes online); in the other form its max is max(x) - h, known, and its sum one
    pass (3; CUDA's too, without a tree for that max); not where the shift can be -inf
    in a row that is not."""
    graph, kernel = fwd_bwd_kernel(f"op f(x: f32[b, n]) -> y {{\n    {body}\n}}\n", "f",
                                   "forward")
    (o,) = online_sums(graph, kernel).values()
    assert o.kind == "logsumexp"
    if passes is None:
        assert o.shift is None and o.max == o.node
        return
    assert o.shift is not None
    assert graph.node(o.max).op == "max" and o.value[0] == graph.node(o.max).args[0]
    assert online(graph, kernel)
    loops = lower(graph, kernel, CPU)
    assert len(loops.passes) == passes + 1
    (shift,) = [s for ps in loops.passes for s in ps.before if isinstance(s, Shift)]
    assert shift.known == (o.max, o.shift[0]) and not shift.nan_flag
    assert len(lower(graph, kernel, CPU, online=True).passes) == passes
    cuda = lower(graph, kernel, CUDA)
    assert len(cuda.passes) == passes + 1
    steps = [s for ps in cuda.passes for s in ps.before] + cuda.after
    assert [s.known for s in steps if isinstance(s, Shift)] == [shift.known]
    assert not any(a.node == o.node and a.role == "m" for s in steps if isinstance(s, Tree)
                   for a, _ in s.accs)


def test_short_rows_in_groups_where_passes_keep_only_row_values(softmax) -> None:
    """The CPU's softmax fwd_bwd runs its passes over groups of ROW_GROUP[0] rows (its
    sums end in the pass that takes their values); its online form, CUDA's kernel and
    layer norm's (centred sums, sums across rows gathered) one row at a time."""
    graph, kernel = softmax
    assert lower(graph, kernel, CPU).row_group == ROW_GROUP[0] > 1
    assert lower(graph, kernel, CPU, online=True).row_group == 1
    assert lower(graph, kernel, CUDA).row_group == 1
    graph, kernel = fwd_bwd_kernel(LAYER_NORM_ROWS, "layer_norm", "fwd_bwd")
    loops = lower(graph, kernel, CPU)
    assert loops.centred and loops.gather and loops.row_group == 1
