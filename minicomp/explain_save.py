"""An Explanation (explain.py) as text and files: the table, report.md, roofline.png, the fused
graph as a picture (graph.svg through graphviz's `dot` when it is installed, else graph.png drawn
with networkx and matplotlib) and the IR and kernel sources of every stage.
"""
from __future__ import annotations

import os
import shutil
import subprocess

COLUMNS = (("step", 22), ("what", 26), ("bytes", 12), ("flops", 13), ("fl/B", 6), ("time us", 9), ("GB/s", 7),
           ("GFLOP/s", 8), ("bound", 8), ("of roof", 7))


def _cells(r) -> list:
    return [f"{r.graph}.{r.name}", r.label[:26], f"{r.bytes:,}", f"{r.flops:,}", f"{r.intensity:.2f}",
            f"{r.time_s * 1e6:.1f}", f"{r.gbps:.2f}", f"{r.gflops:.2f}", r.bound, f"{r.roof_fraction:.0%}"]


def _totals(e) -> list:
    t = e.totals
    return [f"bytes moved: {t.bytes:,} (the least any program of these graphs moves: {t.min_bytes:,}; "
            f"eager's ops: {t.eager_bytes:,})",
            f"launches per call: {t.launches} kernels and torch calls (eager: {t.eager_launches} ops)",
            f"time per call: {t.time_s * 1e6:,.1f} us (eager {t.eager_time_s * 1e6:,.1f} us: "
            f"{t.time_s / t.eager_time_s:.2f}x)" if t.eager_time_s else f"time per call: {t.time_s * 1e6:,.1f} us",
            str(e.roofline)]


def table(e) -> str:
    """The readable table: one line per kernel and torch call, then the totals and refusals."""
    heads = [h for h, _ in COLUMNS]
    body = [_cells(r) for r in e.rows]
    widths = [max(len(x) for x in col) for col in zip(heads, *body)] if body else [len(h) for h in heads]

    def line(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    out = [line(heads), line(["-" * w for w in widths])] + [line(b) for b in body] + [""] + _totals(e)
    eager = getattr(e.report, "eager", [])
    if eager:  # the totals' times include it: code between graphs, graphs torch ran
        out.append(f"ran eagerly ({len(eager)}), inside the compiled time:")
        out += [f"  {x}" for x in eager]
    if e.refusals:
        out.append(f"not fused ({len(e.refusals)}):")
        out += [f"  {r}" for r in e.refusals[:20]] + ([f"  ... and {len(e.refusals) - 20} more"]
                                                       if len(e.refusals) > 20 else [])
    return "\n".join(out)


def _markdown(e) -> str:
    heads = [h for h, _ in COLUMNS]
    lines = ["# minicomp.explain", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in _cells(r)) + " |" for r in e.rows]
    lines += [""] + [f"- {t}" for t in _totals(e)] + ["", "![roofline](roofline.png)", ""]
    lines += ["## Not fused", ""] + [f"- {r}" for r in e.refusals] if e.refusals else []
    lines += ["", "## Report", "", "```", str(e.report), "```", ""]
    return "\n".join(lines)


def roofline_png(e, path: str) -> None:
    """Left: GFLOP/s against arithmetic intensity under the bandwidth and compute roofs; right:
    GB/s against bytes moved under the memory roof of each working-set size."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    roof = e.roofline
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"memory": "tab:blue", "compute": "tab:red", "overhead": "tab:gray"}
    flops_rows = [r for r in e.rows if r.flops and r.time_s]
    xs = [1e-3 * 2 ** (i / 4) for i in range(4 * 24)]
    peak_bw = max(roof.read_gbps)
    left.plot(xs, [min(x * peak_bw, roof.vector_gflops) for x in xs], "k-", label="vector roof (our kernels)")
    left.plot(xs, [min(x * peak_bw, roof.matmul_gflops) for x in xs], "k--", label="matmul roof (BLAS)")
    for r in flops_rows:
        left.scatter(r.intensity, r.gflops, color=colors[r.bound], s=30)
        left.annotate(r.name, (r.intensity, r.gflops), fontsize=7)
    left.set(xscale="log", yscale="log", xlabel="flops per byte", ylabel="GFLOP/s",
             title="roofline: kernels and torch calls")
    left.legend(fontsize=8)
    right.plot(roof.sizes, roof.read_gbps, "k-o", label="read roof")
    right.plot(roof.sizes, roof.copy_gbps, "k--o", label="copy roof")
    for r in e.rows:
        if r.time_s and r.bytes:
            right.scatter(r.bytes, r.gbps, color=colors[r.bound], s=30)
            right.annotate(r.name, (r.bytes, r.gbps), fontsize=7)
    for bound, c in colors.items():
        right.scatter([], [], color=c, label=bound)
    right.set(xscale="log", yscale="log", xlabel="bytes moved per call", ylabel="GB/s", title="bandwidth")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _graphs(e) -> list:
    """[(graph name, [(node, label, is_kernel)], [(from, to)])]: each graph's kernels and torch calls
    after its last pass and the data flow between them (through views), from its IR text."""
    from .ir import parse
    out = []
    for path, text in e.stages.items():
        if not path.endswith("ir_after_plan_memory.txt"):
            continue
        name = path.split(os.sep)[0].split("_", 1)[-1]
        try:
            g = parse(text)
        except Exception:  # a stage that does not read back: no picture of it
            continue
        producer, nodes, edges = {}, [], set()
        for i, n in enumerate(g.nodes):
            if n.op in ("getitem", "constant", "reshape", "permute", "expand", "slice"):
                producer[n] = producer.get(n.args[0]) if n.args else None
                continue
            key = n.attrs["name"] if n.op == "kernel" else f"{n.op}#{i}"
            label = f"{key}\n{n.attrs.get('fused') or 'copy'}"[:24] if n.op == "kernel" else n.op
            producer[n] = key
            nodes.append((key, label, n.op == "kernel"))
            edges.update((producer[a], key) for a in n.args if producer.get(a))
        out.append((name, nodes, sorted(edges)))
    return out


def graph_picture(e, folder: str) -> str:
    graphs = _graphs(e)
    if shutil.which("dot"):
        dot = ["digraph minicomp {", "  rankdir=LR; node [fontsize=10];"]
        for gi, (name, nodes, edges) in enumerate(graphs):
            dot.append(f'  subgraph cluster_{gi} {{ label="{name}";')
            dot += [f'    "{name}.{k}" [label="{label}", shape={"box" if kern else "ellipse"}];'
                    for k, label, kern in nodes]
            dot += [f'    "{name}.{a}" -> "{name}.{b}";' for a, b in edges]
            dot.append("  }")
        dot.append("}")
        path = os.path.join(folder, "graph.svg")
        subprocess.run(["dot", "-Tsvg", "-o", path], input="\n".join(dot), text=True, check=True)
        return path
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx
    widths = []
    layouts = []
    for name, nodes, edges in graphs:
        g = nx.DiGraph()
        g.add_nodes_from(k for k, _, _ in nodes)
        g.add_edges_from(edges)
        layers = list(nx.topological_generations(g))
        for depth, members in enumerate(layers):
            for k in members:
                g.nodes[k]["layer"] = depth
        layouts.append((name, g, nodes, nx.multipartite_layout(g, subset_key="layer") if len(g) else {}))
        widths.append(max(1, len(layers)))
    fig, axes = plt.subplots(len(layouts) or 1, 1, figsize=(max(8, 1.1 * max(widths, default=1)), 3.2 * max(1, len(layouts))),
                             squeeze=False)
    for ax, (name, g, nodes, pos) in zip(axes[:, 0], layouts):
        kernels = [k for k, _, kern in nodes if kern]
        torch_ops = [k for k, _, kern in nodes if not kern]
        nx.draw_networkx_edges(g, pos, ax=ax, arrows=True, alpha=0.5, node_size=900)
        nx.draw_networkx_nodes(g, pos, nodelist=kernels, ax=ax, node_color="#9cf", node_shape="s", node_size=900)
        nx.draw_networkx_nodes(g, pos, nodelist=torch_ops, ax=ax, node_color="#fc9", node_size=900)
        nx.draw_networkx_labels(g, pos, {k: label for k, label, _ in nodes}, ax=ax, font_size=6)
        ax.set_title(f"{name}: kernels (blue) and torch calls (orange)", fontsize=9)
        ax.set_axis_off()
    fig.tight_layout()
    path = os.path.join(folder, "graph.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def save(e, folder: str) -> str:
    """Write report.md, roofline.png, graph.svg or graph.png and stages/ (every stage's IR and
    kernel source) into `folder`; returns the folder."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "report.md"), "w") as f:
        f.write(_markdown(e))
    roofline_png(e, os.path.join(folder, "roofline.png"))
    graph_picture(e, folder)
    for rel, text in e.stages.items():
        path = os.path.join(folder, "stages", rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return folder
