"""``gradc graph``: DOT of an op's IR with the fused kernels as clusters; SVG/PNG/PDF.

The DOT text is read back by Graphviz itself (``dot -Tjson``) where ``dot`` is
installed, else by a structural reading of the writer's one-statement-per-line
layout.  Tests that render need Graphviz; they skip without it, except under
``GRADC_REQUIRE_GRAPHVIZ=1`` (set by ``.ci/run``), where they fail.
"""
from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest
from optional import missing

from gradc.errors import GradcWarning
from gradc.frontend.check import load_program
from gradc.passes.fuse_reduce import cpu_plan
from gradc.pipeline import build_op
from gradc.tools.cli import main
from gradc.tools.draw import GraphError, graph_dot, label, quote, write_graph
from gradc.tools.explain import emit_ir, explain, plan_text

ROOT = Path(__file__).resolve().parents[2]
SEED, ACT = ROOT / "examples" / "seed.grad", ROOT / "examples" / "activations.grad"
EXAMPLE_OPS = [(f, op) for f in (SEED, ACT) for op in load_program(f).main_ops]
HAVE_DOT = shutil.which("dot") is not None


@pytest.fixture
def graphviz():
    """Graphviz's ``dot`` must be there: skip, or fail under GRADC_REQUIRE_GRAPHVIZ=1."""
    if shutil.which("dot") is None:
        missing("graphviz", "Graphviz's dot is not on PATH")


def _unescape(raw: str) -> list[str]:
    """The lines a DOT escString label shows (``\\l``, ``\\n``, ``\\r`` end lines;
    Graphviz also reads HTML entities such as ``&amp;`` in every label)."""
    text = html.unescape(re.sub(r"\\(.)", lambda m: "\n" if m[1] in "lnr" else m[1], raw))
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def read_dot(text: str, graphviz: bool = HAVE_DOT) -> dict:
    """Clusters ``{name: (label lines, node names)}``, nodes ``{name: label lines}``
    and edges ``[(tail, head)]`` of DOT text, as Graphviz reads it when installed."""
    if graphviz:
        r = subprocess.run(["dot", "-Tjson"], input=text.encode(), capture_output=True)
        assert r.returncode == 0 and not r.stderr, r.stderr.decode()
        objs = json.loads(r.stdout)["objects"]
        nodes = {o["name"]: _unescape(o["label"]) for o in objs if "nodes" not in o}
        clusters = {o["name"]: (_unescape(o["label"]), sorted(objs[i]["name"] for i in o["nodes"]))
                    for o in objs if "nodes" in o}
        edges = [(objs[e["tail"]]["name"], objs[e["head"]]["name"])
                 for e in json.loads(r.stdout).get("edges", [])]
        return {"clusters": clusters, "nodes": nodes, "edges": sorted(edges)}
    assert text.count("{") == text.count("}") and text.startswith("digraph ")
    clusters, nodes, edges, stack = {}, {}, [], []
    q = r'"((?:[^"\\]|\\.)*)"'
    for line in text.splitlines()[1:]:
        s = line.strip()
        if m := re.fullmatch(rf"subgraph {q} {{", s):
            stack.append(m[1])
            clusters[m[1]] = [None, []]
        elif s == "}":
            if stack:               # the last one closes the digraph
                stack.pop()
        elif m := re.fullmatch(rf"graph \[label={q}.*\];", s):
            if stack:
                clusters[stack[-1]][0] = _unescape(m[1])
        elif m := re.fullmatch(rf"{q} -> {q}( \[.*\])?;", s):
            edges.append((m[1], m[2]))
        elif m := re.fullmatch(rf"{q} \[label={q}.*\];", s):
            nodes[m[1]] = _unescape(m[2])
            for c in stack:
                clusters[c][1].append(m[1])
        else:
            assert re.fullmatch(r"(graph|node|edge) \[.*\];", s), s
    return {"clusters": {k: (v[0], sorted(v[1])) for k, v in clusters.items()}, "nodes": nodes,
            "edges": sorted(edges)}


def _explained_kernels(path, op: str, method: str) -> list[str]:
    """Each kernel of ``gradc explain``'s fused CPU plan of ``method``, as one line."""
    lines = explain(str(path), op).splitlines()
    start = next(k for k, l in enumerate(lines)
                 if l.startswith(f"kernel plan of {method} (fused, CPU)"))
    kernels: list[str] = []
    current = None
    for line in lines[start + 1:]:
        if not line.strip():
            break
        if re.match(r"  \[\d+\] ", line):
            current = line if " kernel over " in line else None
            if current is not None:
                kernels.append(current)
        elif line.startswith("      ") and current is not None:
            kernels[-1] += " " + line.strip()
        else:
            current = None
    return kernels


def _ir_rows(path, op: str, method: str) -> dict[int, tuple[str, str, str]]:
    """``--emit ir``'s rows of one method: id -> (op(args), dtype shape, file:line)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GradcWarning)      # W405 of ops without jvp
        lines = emit_ir(str(path), [op]).splitlines()
    start = next(k for k, l in enumerate(lines) if re.fullmatch(rf"  {method} \(\d+ nodes\):", l))
    rows = {}
    for line in lines[start + 1:]:
        if line.strip().startswith("return"):
            break
        ident, rest = line.strip().split(" = ", 1)
        head, type_, *where = re.split(r"\s{2,}", rest)
        rows[int(ident[1:])] = (head, type_, where[0][2:] if where else "")
    return rows


def _node_statements(text: str) -> Counter:
    """How often each node is declared (given a label) in DOT text."""
    return Counter(re.findall(r'^\s*"(\w+)" \[label=', text, flags=re.M))


def _norm(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path, op", EXAMPLE_OPS, ids=[o for _, o in EXAMPLE_OPS])
def test_every_ir_node_once_and_one_cluster_per_kernel(path, op):
    """Each method drawn: every node of --emit ir once, labelled as it prints it, one
    edge per operand, and one cluster per kernel of explain's plan, labelled alike."""
    program = load_program(path)
    cop = build_op(program.ops[op], program.ops, program.consts)
    methods = [m for m in ("forward", "vjp", "fwd_bwd", "jvp") if m in cop.methods]
    text = graph_dot(path, op, methods)
    drawn = read_dot(text)
    assert set(_node_statements(text).values()) == {1}       # each node declared once
    for m in methods:
        g = cpu_plan(cop.methods[m].fused).graph   # the method's graph + the CPU lowering's nodes
        mine = {n: lines for n, lines in drawn["nodes"].items() if n.startswith(f"{m}_n")}
        assert sorted(int(n.rsplit("n", 1)[1]) for n in mine) == sorted(n.id for n in g)
        for nid, (head, type_, where) in _ir_rows(path, op, m).items():
            first, *rest = mine[f"{m}_n{nid}"]
            assert re.fullmatch(rf"%{nid}( \(t\d+\))? = {re.escape(head)}", first), first
            assert rest[:2] == ([type_, where] if where else [type_, rest[1]])
        assert sorted(e for e in drawn["edges"] if e[1].startswith(f"{m}_n")) == sorted(
            (f"{m}_n{a}", f"{m}_n{n.id}") for n in g for a in n.args)
        kernels = {k: v for k, v in drawn["clusters"].items()
                   if re.fullmatch(rf"cluster_{m}_k\d+", k)}
        if m == "vjp":          # explain prints no vjp plan; the same text, from the plan
            plan = plan_text(cpu_plan(cop.methods[m].fused), "")
            want = [l.strip() for l in plan if re.match(r"  \[\d+\] kernel", l)]
            assert len(kernels) == len(want)
            continue
        want = _explained_kernels(path, op, m)
        assert len(kernels) == len(want) and want
        labels = [_norm(" ".join(lines)) for lines, _ in kernels.values()]
        assert sorted(labels) == sorted(_norm(w) for w in want)
        for name, (_, members) in kernels.items():    # a kernel's nodes are drawn in it
            k = int(name.rsplit("k", 1)[1])
            step = cpu_plan(cop.methods[m].fused).steps[k]
            assert {int(x.rsplit("n", 1)[1]) for x in members} <= set(step.nodes)


def test_structural_reading_agrees_with_graphviz(graphviz):
    """The fallback reader (used where Graphviz is missing) reads what dot reads."""
    text = graph_dot(SEED, "mlp", ["both"])
    assert read_dot(text, graphviz=False) == read_dot(text, graphviz=True)


HOSTILE = ['say "hi"', "back\\slash \\N \\l \\G \\", "a\nb", "}; node [shape=box]; {",
           "-> -- <b>html</b> &amp; &lambda; &#955; & a", "subgraph", "digraph", "ünïcødé λ", "tab\there", "",
           '\\"', "\\\\"]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_labels_keep_hostile_strings_literal(graphviz, text):
    """A label shows its text exactly (control characters escaped), in Graphviz's
    reading and in the SVG."""
    shown = text.replace("\n", "\\n").replace("\t", "\\t")
    dot = f"digraph {{ n [label={label([text, 'x'])}]; }}"
    r = subprocess.run(["dot", "-Tjson"], input=dot.encode(), capture_output=True)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    assert _unescape(json.loads(r.stdout)["objects"][0]["label"]) == [shown, "x"]
    svg = subprocess.run(["dot", "-Tsvg"], input=dot.encode(), capture_output=True).stdout
    texts = [t.text or "" for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert texts == ([shown, "x"] if shown.strip() else ["x"])


@pytest.mark.parametrize("text", [t for t in HOSTILE if not re.search(r'\\(?=["\n]|$)', t)])
def test_quoted_ids_read_back_exactly(graphviz, text):
    dot = f"digraph {quote(text)} {{ {quote(text)} -> {quote(text + '2')}; }}"
    r = subprocess.run(["dot", "-Tjson"], input=dot.encode(), capture_output=True)
    assert r.returncode == 0 and not r.stderr, r.stderr.decode()
    out = json.loads(r.stdout)
    assert out["name"] == text and [o["name"] for o in out["objects"]] == [text, text + "2"]


@pytest.mark.parametrize("text", ["a\\", 'a\\"b', "a\\\nb"])
def test_ids_dot_cannot_write_are_refused(text):
    with pytest.raises(ValueError, match="backslash"):
        quote(text)


SVG_NS = "{http://www.w3.org/2000/svg}"


def _svg_texts(path: Path) -> list[str]:
    return [t.text or "" for t in ET.parse(path).getroot().iter(f"{SVG_NS}text")]


@pytest.mark.parametrize("method, drawn", [
    (None, ["fwd_bwd"]), (["forward"], ["forward"]), (["vjp"], ["vjp"]),
    (["fwd_bwd"], ["fwd_bwd"]), (["jvp"], ["jvp"]), (["both"], ["forward", "vjp"]),
    (["jvp", "forward", "jvp"], ["jvp", "forward"])])
def test_method_choices(tmp_path, capsys, method, drawn):
    """--method draws the named graphs (default fwd_bwd; both: forward and vjp);
    several are side by side, each in its cluster, in the order given."""
    out = tmp_path / "g.dot"
    argv = ["graph", str(SEED), "scaled_tanh", "-o", str(out)]
    assert main(argv + [a for m in method or () for a in ("--method", m)]) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    text = out.read_text()
    heads = re.findall(r'(?:label="|\\l)(forward|vjp|fwd_bwd|jvp): (\d+) nodes;', text)
    assert [m for m, _ in heads] == drawn
    program = load_program(SEED)
    cop = build_op(program.ops["scaled_tanh"], program.ops, program.consts)
    assert [int(n) for _, n in heads] == [len(cop.methods[m].graph) for m in drawn]
    methods = re.findall(r'subgraph "cluster_(forward|vjp|fwd_bwd|jvp)" \{', text)
    assert methods == (drawn if len(drawn) > 1 else [])


def test_svg_is_xml_with_the_node_labels(tmp_path, graphviz):
    out = tmp_path / "mlp.svg"
    assert main(["graph", str(SEED), "mlp", "-o", str(out)]) == 0
    texts = _svg_texts(out)
    for want in ("%7 (t1) = tanh(%6)", "custom op scaled_tanh (forward)", "output grad_w1",
                 "custom rule: grad block of scaled_tanh", "%10 = param dlogits",
                 "cotangent of logits", "seed.grad:44"):
        assert want in texts, want
    assert sum(t.startswith("[") and " kernel over " in t for t in texts) == 2
    assert ET.parse(out).getroot().tag == f"{SVG_NS}svg"


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".pdf", b"%PDF-")])
def test_png_and_pdf(tmp_path, graphviz, suffix, magic):
    out = tmp_path / f"huber{suffix}"
    assert main(["graph", str(ACT), "huber", "--method", "both", "-o", str(out)]) == 0
    assert out.read_bytes().startswith(magic)
    assert not [p for p in tmp_path.iterdir() if p != out]      # no temporary file left


def test_hostile_names_are_drawn_literally(tmp_path, graphviz):
    """An op and parameters named as DOT keywords, a file name with quotes,
    backslashes and braces: DOT parses, and the SVG shows the names as written."""
    src = tmp_path / 'we"ird \\ {name}.grad'
    src.write_text("op subgraph(node, edge) -> digraph {\n"
                   "    digraph = node * edge\n"
                   "} grad(ddigraph) -> (dnode, dedge) {\n"
                   "    dnode = ddigraph * edge\n"
                   "    dedge = ddigraph * node\n}\n")
    out = tmp_path / "g.svg"
    assert main(["graph", str(src), "subgraph", "-o", str(out), "--method", "both"]) == 0
    texts = _svg_texts(out)
    assert f"{src.name}: op subgraph(node, edge) -> digraph" in texts
    assert "%0 = param node" in texts and "output grad_node" in texts
    assert f"{src.name}:4" in texts
    drawn = read_dot(graph_dot(src, "subgraph", ["fwd_bwd"]))
    assert sum(l[-1] == "custom rule: grad block of subgraph" for l in drawn["nodes"].values()
               if l[-1].startswith("custom")) == 2


def test_unknown_op_exits_1(tmp_path, capsys):
    assert main(["graph", str(SEED), "nope", "-o", str(tmp_path / "g.dot")]) == 1
    err = capsys.readouterr().err
    assert "no op 'nope'" in err and "ops: custom_linear, sign_ste" in err
    assert not list(tmp_path.iterdir())


def test_unknown_suffix_exits_1_before_compiling(tmp_path, capsys):
    assert main(["graph", str(tmp_path / "missing.grad"), "x", "-o", str(tmp_path / "g.jpg")]) == 1
    assert capsys.readouterr().err == (
        f"error: cannot write '{tmp_path / 'g.jpg'}': the suffix must be one of .dot, .gv, "
        ".svg, .png, .pdf (DOT text: .dot or .gv)\n")


def test_missing_method_exits_1(tmp_path, capsys):
    assert main(["graph", str(SEED), "clipped_relu", "--method", "jvp",
                 "-o", str(tmp_path / "g.dot")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: op clipped_relu has no jvp method: ") and "not linear" in err
    with pytest.raises(GraphError, match="unknown method 'hessian'"):
        graph_dot(SEED, "mlp", ["hessian"])


def test_without_graphviz_rendering_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    out = tmp_path / "g.svg"
    assert main(["graph", str(SEED), "mlp", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: writing g.svg needs Graphviz's 'dot' program, which is "
                          "not on PATH: ")
    for hint in ("apt-get install graphviz", "brew install graphviz",
                 "conda install graphviz", "-o FILE.dot"):
        assert hint in err
    assert not out.exists()
    assert main(["graph", str(SEED), "mlp", "-o", str(tmp_path / "g.gv")]) == 0  # DOT: no dot
    assert (tmp_path / "g.gv").read_text().startswith('digraph "mlp" {')


def test_a_failing_dot_leaves_the_old_file(tmp_path, graphviz):
    out = tmp_path / "g.svg"
    out.write_text("old")
    with pytest.raises(GraphError, match="Graphviz's dot failed on g.svg"):
        write_graph("digraph { a -> }", out)
    assert out.read_text() == "old" and len(list(tmp_path.iterdir())) == 1


def test_a_recomputed_value_is_drawn_once(tmp_path):
    """``s = sin(x) * 2 + 1`` is computed in the forward loop and recomputed in the
    backward one (not stored): it is drawn once, in the first kernel, and the
    second kernel's label says that it recomputes it."""
    src = tmp_path / "shifted.grad"
    src.write_text("op shifted(x: f32[b], y: f32[b]) -> (m, p) {\n    s = sin(x) * 2 + 1\n"
                   "    m = mean(s * y)\n    p = s * sum(y) + x\n}\n")
    text = graph_dot(src, "shifted")
    assert set(_node_statements(text).values()) == {1}
    drawn = read_dot(text)
    kernels = {int(k[len("cluster_k"):]): v for k, v in drawn["clusters"].items()}
    ((k, (lines, members)),) = [(k, v) for k, v in kernels.items() if "recomputes" in " ".join(v[0])]
    refs = re.search(r"recomputes (.*?) from values it reads", " ".join(lines))[1].split(", ")
    by_ref = {re.match(r"(%\d+)", l[0])[1]: n for n, l in drawn["nodes"].items()}
    by_ref |= {m[1]: n for n, l in drawn["nodes"].items() if (m := re.search(r"\((t\d+)\) =", l[0]))}
    assert "sin" in " ".join(drawn["nodes"][by_ref[r]][0] for r in refs)
    for r in refs:
        assert by_ref[r] not in members
        assert any(by_ref[r] in v[1] for j, v in kernels.items() if j < k)
