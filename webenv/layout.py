"""A small CSS flow layout for the mirror: block boxes, line boxes, baselines, and line breaking.

It covers what the mirrored MiniWoB++ pages use: block stacking with sibling margin collapsing, inline
formatting contexts holding text, inline elements (span, label) and atomic inline-blocks (button,
input), ``<br>``, ``display: none`` and absolute positioning. Line breaking is greedy at spaces and
around atomic inlines, with widths from the Liberation Sans tables in ``fonts.py`` — enough to put
every word on the line where Chromium puts it, which decides how a wrapped text node splits into
``t`` fragments. Lengths follow Chromium's arithmetic: glyph advances in 16.16 fixed point, each
inline item's width rounded up to a LayoutUnit (1/64 px), boxes snapped to LayoutUnits. On the
mirrored pages the boxes equal Chromium's (``tests/test_webenv*.py`` compare them); elsewhere they are
the mirror's own deterministic layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .dom import Node, Page, Text
from .fonts import Font, ceil64, snap

VIEWPORT_WIDTH, VIEWPORT_HEIGHT = 780, 437  # window.innerWidth/innerHeight of miniwob's headless window
SCROLLBAR_WIDTH = 15
BODY_FONT = Font(14)


def layout_page(page: Page) -> None:
    body = page.body
    for node in body.walk():
        node.box = None
        for kid in node.children:
            if isinstance(kid, Text):
                kid.fragments = []
    height = _block_contents(body, 0, 0, VIEWPORT_WIDTH, BODY_FONT)
    body.box = (0.0, 0.0, float(VIEWPORT_WIDTH), snap(height))
    for hook in page.layout_hooks:  # task-specific boxes (floats, widget positions)
        hook(page)
    _absolutes(body, BODY_FONT, static_y=height)
    bottom = max([height] + [n.box[1] + n.box[3] for n in body.walk() if n.style.absolute is not None and n.rendered])
    if bottom > VIEWPORT_HEIGHT:  # the page scrolls: a vertical scrollbar narrows <body>
        body.box = (0.0, 0.0, float(VIEWPORT_WIDTH - SCROLLBAR_WIDTH), body.box[3])


def _font(node: Node, inherited: Font) -> Font:
    return node.style.font or inherited


def _collapse(*margins: float) -> float:
    """Adjoining margins collapse to the largest positive plus the most negative one (CSS 2 8.3.1)."""
    return max(max(margins), 0.0) + min(min(margins), 0.0)


def _collapsed_top(node: Node) -> float:
    """The top margin of a block, with its first child's top margin collapsed through it when it
    has no top border or padding (CSS 2 margin collapsing, the case the mirrored pages use).
    Absolutely positioned and floated boxes start a new formatting context: nothing collapses."""
    st = node.style
    mt = st.margin[0]
    if st.border[0] or st.padding[0] or st.absolute is not None or st.float_left:
        return mt
    first = next((k for k in node.children if isinstance(k, Node) and k.style.display != "none"
                  and k.style.absolute is None), None)
    if first is None or first.style.display != "block" or first.tag in ("button", "input", "textarea"):
        return mt
    if any(isinstance(k, Text) and k.data.strip() for k in node.children[: node.children.index(first)]):
        return mt
    return _collapse(mt, _collapsed_top(first))


def _block(node: Node, x: float, y: float, avail: float, font: Font) -> float:
    """Lay out a block box whose margin box starts at (x, y); returns its border-box height.
    ``y`` is where the (collapsed) top margin starts."""
    st = node.style
    mt, mr, mb, ml = st.margin
    pt, pr, pb, pl = st.padding
    bt, br, bb, bl = st.border
    font = _font(node, font)
    top = _collapsed_top(node)
    width = st.width if st.width is not None else avail - ml - mr - pl - pr - bl - br
    inner_top = y + top + bt + pt
    content = _block_contents(node, x + ml + bl + pl, inner_top, width, font, closed=bool(pb or bb),
                              collapse_first=not (bt or pt))
    height = (st.height if st.height is not None else content) + pt + pb + bt + bb
    node.box = (snap(x + ml), snap(y + top), snap(width + pl + pr + bl + br), snap(height))
    return height


def _max_content_width(node: Node, font: Font) -> float:
    """Shrink-to-fit width of a float: its widest line with no wrapping."""
    _block_contents(node, 0, 0, 1e6, _font(node, font))
    right = 0.0
    for n in node.walk():
        if n is not node and n.box is not None:
            right = max(right, n.box[0] + n.box[2])
        n.box = None  # a measuring pass: the real layout follows
        for kid in n.children:
            if isinstance(kid, Text):
                right = max([right] + [f[2] + f[4] for f in kid.fragments])
                kid.fragments = []
    return right


def _block_contents(node: Node, x: float, y: float, width: float, font: Font, closed: bool = True,
                    collapse_first: bool = False) -> float:
    """Stack the children: block boxes, and runs of inline content as anonymous blocks.
    With ``collapse_first`` the first block child's top margin has already been collapsed into the
    parent's (``_collapsed_top``)."""
    cursor, pending = 0.0, 0.0  # pending: the previous block's bottom margin, not yet placed
    floats_x, floats_bottom = x, 0.0  # left floats placed side by side; what follows clears them
    first_block = collapse_first
    run: list[Node | Text] = []

    def flush_run() -> None:
        nonlocal cursor, pending, first_block, floats_bottom
        if run:
            if floats_bottom and any(isinstance(k, Node) or k.data.strip() for k in run):
                cursor, pending, floats_bottom = max(cursor + pending, floats_bottom), 0.0, 0.0
            h = _inline(run, x, y + cursor + pending, width, font)
            if h:
                cursor, pending, first_block = cursor + pending + h, 0.0, False
            run.clear()

    for kid in node.children:
        if isinstance(kid, Node) and kid.style.float_left and kid.style.display != "none":
            fw = _max_content_width(kid, font)
            kid.style.width = fw
            h = _block(kid, floats_x, y + cursor + pending, fw, font)
            kid.style.width = None
            floats_x += fw
            floats_bottom = max(floats_bottom, cursor + pending + h)
            continue
        if isinstance(kid, Text) or kid.style.display in ("inline", "inline-block"):
            if not (isinstance(kid, Node) and kid.style.absolute is not None):
                run.append(kid)
            continue
        if kid.style.display == "none" or kid.style.absolute is not None:
            continue
        flush_run()
        if floats_bottom:
            cursor, pending, floats_bottom = max(cursor + pending, floats_bottom), 0.0, 0.0
        mt, mb = kid.style.margin[0], kid.style.margin[2]
        if kid.tag in ("button", "input", "textarea"):  # a block-level control keeps its own size
            gap = _collapse(pending, mt)
            w, h, _ = _atom_size(kid, font)
            kid.box = (snap(x + kid.style.margin[3]), snap(y + cursor + gap), snap(w), snap(h))
            cursor += gap + h
        else:
            ct = 0.0 if first_block else _collapsed_top(kid)
            gap = _collapse(pending, ct)
            h = _block(kid, x, y + cursor + gap - _collapsed_top(kid), width, font)
            cursor += gap + h
        first_block = False
        pending = mb
    flush_run()
    cursor = max(cursor, floats_bottom)
    return cursor + (pending if closed else 0.0)


def _absolutes(node: Node, font: Font, static_y: float) -> None:
    """Absolutely positioned descendants, laid out against the page (their containing block here)."""
    font = _font(node, font)
    for kid in node.children:
        if not isinstance(kid, Node) or kid.style.display == "none":
            continue
        if kid.style.absolute is not None:
            left, top = kid.style.absolute
            if kid.style.display == "inline-block" or kid.tag in ("button", "input"):
                w, h, _ = _atom_size(kid, font)
                ml, mt = kid.style.margin[3], kid.style.margin[0]
                y = static_y if top is None else top
                kid.box = (snap(left + ml), snap(y + mt), snap(w), snap(h))
            else:
                _block(kid, left, static_y if top is None else top, kid.style.width or 0, font)
        _absolutes(kid, font, static_y)


# --- inline formatting ---------------------------------------------------------------------------

@dataclass
class _Item:
    kind: str  # char | atom | open | close | br
    node: Node | None = None
    text: Text | None = None
    index: int = -1  # index into text.data
    char: str = ""
    font: Font | None = None
    width: float = 0.0
    ascent: float = 0.0
    descent: float = 0.0
    x: float = 0.0
    size: tuple[float, float, float] = (0.0, 0.0, 0.0)  # an atom's border box and baseline


@dataclass
class _Line:
    items: list[_Item] = field(default_factory=list)
    top: float = 0.0
    ascent: float = 0.0
    descent: float = 0.0


def _collect(nodes: list[Node | Text], font: Font, out: list[_Item], state: dict) -> None:
    for kid in nodes:
        if isinstance(kid, Text):
            for i, ch in enumerate(kid.data):
                if ch in " \t\n\r\f":
                    if state["space"]:
                        continue
                    ch, state["space"] = " ", True
                else:
                    state["space"] = False
                out.append(_Item("char", text=kid, index=i, char=ch, font=font,
                                 ascent=font.ascent, descent=font.descent))
            continue
        st = kid.style
        if st.display == "none" or st.absolute is not None:
            continue
        f = _font(kid, font)
        if kid.tag == "br":
            out.append(_Item("br", node=kid, ascent=f.ascent, descent=f.descent))
            state["space"] = True
        elif st.display == "inline-block" or kid.tag in ("button", "input", "textarea", "select"):
            w, h, base = _atom_size(kid, f)
            mt, mr, mb, ml = st.margin
            out.append(_Item("atom", node=kid, width=ml + w + mr, ascent=mt + base, descent=h - base + mb,
                             size=(w, h, base)))
            state["space"] = False
        else:
            out.append(_Item("open", node=kid, font=f))
            _collect(kid.children, f, out, state)
            out.append(_Item("close", node=kid, font=f))


def _atom_size(node: Node, font: Font) -> tuple[float, float, float]:
    """Border-box width and height of an inline-block, and its baseline from the border-box top."""
    st = node.style
    pt, pr, pb, pl = st.padding
    bt, br, bb, bl = st.border
    f = _font(node, font)
    if node.tag == "input" and node.input_type in ("checkbox", "radio"):
        w, h = (st.width or 13), (st.height or 13)
        size = (w + pl + pr + bl + br, h + pt + pb + bt + bb, h + pt + pb + bt + bb)
    elif node.tag in ("input", "textarea"):
        w = st.width if st.width is not None else 153
        size = (w + pl + pr + bl + br, f.line_height + pt + pb + bt + bb, bt + pt + f.ascent)
    else:  # button and other inline-blocks: shrink to fit their text
        text = " ".join(node.text_content.split())
        w = st.width if st.width is not None else ceil64(f.width(text))
        inner = st.height if st.height is not None else f.line_height
        size = (w + pl + pr + bl + br, inner + pt + pb + bt + bb, bt + pt + f.ascent)
    return size


def _inline(nodes: list[Node | Text], x: float, y: float, width: float, font: Font) -> float:
    """Lay out one inline formatting context; returns the total height of its line boxes."""
    items: list[_Item] = []
    _collect(nodes, font, items, {"space": True})
    if not any(it.kind in ("char", "atom", "br") for it in items):
        return 0.0
    prev: _Item | None = None  # one shaped run: kerning carries across element boundaries
    for it in items:
        if it.kind == "char":
            if prev is not None:
                prev.width = prev.font.advances(prev.char, it.char if it.font == prev.font else "")[0]
            prev = it
        elif it.kind in ("atom", "br"):
            if prev is not None:
                prev.width = prev.font.advances(prev.char)[0]
            prev = None
    if prev is not None:
        prev.width = prev.font.advances(prev.char)[0]

    lines = _break_lines(items, width)
    top = y
    carried: dict[int, tuple[Node, Font]] = {}
    for line in lines:
        line.ascent = max([font.ascent] + [it.ascent for it in line.items if it.kind in ("char", "atom", "br")])
        line.descent = max([font.descent] + [it.descent for it in line.items if it.kind in ("char", "atom", "br")])
        line.top = top
        # Chromium gives each inline item (a text node's run on a line, an atom) a LayoutUnit width,
        # the shaped width rounded up to 1/64 px, and places items end to end.
        start, run, prev_owner = x, 0.0, None
        for it in line.items:
            owner = id(it.text) if it.kind == "char" else id(it)
            if owner != prev_owner:
                start, run, prev_owner = start + ceil64(run), 0.0, owner
            it.x = start + run
            run += it.width
        top += line.ascent + line.descent
        carried = _place(line, carried)
    return top - y


def _last_content(seg: list[_Item]) -> _Item | None:
    for it in reversed(seg):
        if it.kind not in ("open", "close"):
            return it
    return None


def _break_lines(items: list[_Item], width: float) -> list[_Line]:
    """Greedy line breaking at spaces and around atomic inlines; trailing spaces hang."""
    segments: list[list[_Item]] = [[]]
    for it in items:
        seg = segments[-1]
        last = _last_content(seg)
        if it.kind == "atom":
            starts_new = True
        elif it.kind in ("char", "open") and last is not None:
            after_space = last.kind == "char" and last.char == " " and not (it.kind == "char" and it.char == " ")
            starts_new = last.kind == "atom" or after_space
        else:
            starts_new = False
        if starts_new and seg:
            segments.append([it])
        else:
            seg.append(it)
        if it.kind == "br":
            segments.append([])
    lines = [_Line()]
    used = 0.0
    for seg in segments:
        if not seg:
            continue
        full = sum(it.width for it in seg)
        trailing = 0.0
        for it in reversed(seg):
            if it.kind == "char" and it.char == " ":
                trailing += it.width
            elif it.kind not in ("open", "close"):
                break
        has_content = any(it.kind in ("char", "atom") for it in lines[-1].items)
        if has_content and snap(used + full - trailing) > width + 1e-9:
            lines.append(_Line())
            used = 0.0
        lines[-1].items.extend(seg)
        used += full
        if seg[-1].kind == "br":
            lines.append(_Line())
            used = 0.0
    if not lines[-1].items:
        lines.pop()
    return lines


def _place(line: _Line, carried: dict[int, tuple[Node, Font]]) -> dict[int, tuple[Node, Font]]:
    """Boxes for the atoms, inline elements and text fragments of one line; returns still-open elements."""
    baseline = line.top + line.ascent
    for it in line.items:
        if it.kind == "atom":
            node = it.node
            st = node.style
            left = it.x + st.margin[3]
            top = baseline - it.ascent + st.margin[0]
            w, h, _ = it.size
            node.box = (snap(left), snap(top), snap(w), snap(h))
            _atom_contents(node, left, top)
        elif it.kind == "br":
            it.node.box = (snap(it.x), snap(baseline - it.ascent), 0.0, snap(it.ascent + it.descent))
    # inline elements: the union of their content on each line (a line where an element holds only
    # a hanging space does not count)
    start = line.items[0].x if line.items else 0.0
    opened: dict[int, list] = {k: [n, f, start, False] for k, (n, f) in carried.items()}
    content_end = start
    for it in line.items:
        if it.kind in ("char", "atom") and not (it.kind == "char" and it.char == " "):
            content_end = it.x + it.width
    for it in line.items:  # spaces at the end of the line hang outside every box
        if it.kind == "open":
            opened[id(it.node)] = [it.node, it.font, it.x, False]
        elif it.kind == "close" and id(it.node) in opened:
            node, f, x0, seen = opened.pop(id(it.node))
            if seen or node.box is None:
                _extend(node, x0, min(it.x, max(content_end, x0)), baseline - f.ascent, f.ascent + f.descent)
        elif it.kind in ("char", "atom") and it.x < content_end:
            for entry in opened.values():
                entry[3] = True
    for node, f, x0, seen in opened.values():  # the element goes on past the end of this line
        if seen:
            _extend(node, x0, content_end, baseline - f.ascent, f.ascent + f.descent)
    # text fragments: the characters of each text node on this line (a hanging end space excluded)
    runs: dict[int, list[_Item]] = {}
    for it in line.items:
        if it.kind == "char":
            runs.setdefault(id(it.text), []).append(it)
    last_char = next((it for it in reversed(line.items) if it.kind == "char"), None)
    for run in runs.values():
        first, last = run[0], run[-1]
        end_x = last.x + (0.0 if (last is last_char and last.char == " ") else last.width)
        f = first.font
        first.text.fragments.append((first.index, last.index + 1, snap(first.x), snap(baseline - f.ascent),
                                     ceil64(end_x - first.x), float(f.ascent + f.descent)))
    return {k: (n, f) for k, (n, f, _, _) in opened.items()}


def _extend(node: Node, x0: float, x1: float, top: float, height: float) -> None:
    left, bottom = snap(x0), top + height
    right = left + ceil64(x1 - x0)
    if node.box is None:
        node.box = (left, snap(top), right - left, snap(height))
        return
    bl, bt, bw, bh = node.box
    nl, nt = min(bl, left), min(bt, top)
    node.box = (nl, snap(nt), max(bl + bw, right) - nl, snap(max(bt + bh, bottom) - nt))


def _atom_contents(node: Node, left: float, top: float) -> None:
    """Boxes for an inline-block's own children (e.g. the text of a button needs none)."""
    st = node.style
    inner_x = left + st.border[3] + st.padding[3]
    inner_y = top + st.border[0] + st.padding[0]
    for kid in node.children:
        if isinstance(kid, Node) and kid.style.display != "none":
            _block(kid, inner_x, inner_y, st.width or 0, st.font or BODY_FONT)
