"""Layout conversions only where a region of one memory layout borders another.

Note [Layout regions]: lamina's image operators, elementwise operators and concat give
results in the layout of their images (Note [Result layouts]), so a program that starts
channels-last stays channels-last and a region converts only at its borders: where
images enter (``to_layout`` by the user, or the first call that follows another
layout) and where they leave (a flatten to features, which copies into NCHW order).
``conversions`` counts them in a graph. The pass removes the conversions that are not
borders: a ``to_layout`` of an image already in that layout, and a pair that converts
there and back (``to_layout(to_layout(x, "NHWC"), "NCHW")`` of an NCHW ``x`` is ``x``).
It leaves a conversion whose result is returned or written in place (the program's own
tensor, as eager gives it). It adds none: which layout a network runs best in is the
user's choice, at its input (docs/performance.md, "Tuning", measures both).
"""

from __future__ import annotations

from lamina.dispatch import layouts

from ..graph import Graph, Node, Value, map_values


def layout_of(value: Value) -> str | None:
    """ "NCHW", "NHWC" or None (not an image in a dense layout)."""
    return layouts.image_layout(value.shape, value.strides)


def conversions(graph: Graph) -> list[Node]:
    """The calls of ``graph`` that change an image's memory layout: ``to_layout`` calls
    that do, calls of an image operator whose 4-D result is in another layout than its
    image input, and flattens (reshape) of channels-last images."""
    found = []
    for node in graph.nodes:
        images = [v for v in node.inputs() if len(v.shape) == 4]
        if not images or not node.results:
            continue
        source, result = layout_of(images[0]), node.results[0]
        if len(result.shape) == 4:
            if source is not None and not layouts.in_layout(result.shape, result.strides, source):
                found.append(node)
        elif node.name == "reshape" and source == layouts.NHWC:
            found.append(node)
    return found


def run(graph: Graph) -> Graph:
    if any(node.writes() for node in graph.nodes):
        return graph
    returned = set(graph.output_values())
    renamed: dict[Value, Value] = {}
    for node in graph.nodes:
        node.args = map_values(node.args, lambda v: renamed.get(v, v))
        if node.name != "to_layout" or node.results[0] in returned:
            continue
        x, target = node.args[0], node.args[1]
        made_by = x.node
        if layout_of(x) == target:  # already there
            renamed[node.results[0]] = x
        elif made_by is not None and made_by.name == "to_layout":
            original = made_by.args[0]
            if layout_of(original) == target:  # there and back
                renamed[node.results[0]] = original
    graph.outputs = map_values(graph.outputs, lambda v: renamed.get(v, v))
    return graph
