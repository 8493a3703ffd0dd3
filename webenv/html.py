"""Element builders with the styles MiniWoB++'s ``core.css`` and Chromium's defaults give them.

``page_skeleton`` is the ``<body><div id="wrap"><div id="query"></div><div id="area"></div></div>``
every MiniWoB++ task shares (``#wrap`` 160×210, ``#query`` 44 px + 3 px padding, ``#area`` 10 px
font + 2 px padding, ``<body>`` Arial 14 px). Buttons and text inputs use Chromium's form-control font
(Arial 13.33 px, drawn at 13.328125 px), a 2 px border, and 1px/6px (button) or 1px/2px (input) padding;
``button.secondary-action`` has 6px/25px padding; a checkbox is 13×13 with margins 3px 3px 3px 4px
and sits on its bottom edge.
"""

from __future__ import annotations

from .dom import Node, Page, Style, Text
from .fonts import Font
from .layout import layout_page

AREA_FONT = Font(10)
CONTROL_FONT = Font(853 / 64)  # 10pt = 13.333px, which Skia sets as 13.328125 (1/64 px steps)


def page_skeleton(area_padding: float = 2, area_classes: str = "") -> tuple[Page, Node]:
    """The shared page; returns it and its ``#area``."""
    body = Node("body", style=Style(font=Font(14)))
    wrap = Node("div", id="wrap", style=Style(width=160, height=210))
    query = Node("div", id="query", style=Style(font=AREA_FONT, height=44, padding=(3, 3, 3, 3)))
    p = area_padding
    area = Node("div", id="area", classes=area_classes, style=Style(font=AREA_FONT, padding=(p, p, p, p)))
    body.append(wrap)
    wrap.append(query, area)
    return Page(body, layout_page), area


def ws(text: str = "\n") -> Text:
    """A whitespace text node from the HTML source (collapsible, never reported)."""
    return Text(text)


def div(text: str | None = None, **kw) -> Node:
    node = Node("div", **kw)
    if text is not None:
        node.append(text)
    return node


def span(text: str | None = None, **kw) -> Node:
    node = Node("span", style=kw.pop("style", Style(display="inline")), **kw)
    if text is not None:
        node.append(text)
    return node


def label(text: str | None = None, control: Node | None = None, **kw) -> Node:
    node = Node("label", style=kw.pop("style", Style(display="inline")), label_for=control, **kw)
    if text is not None:
        node.append(text)
    return node


def br() -> Node:
    return Node("br", style=Style(display="inline"))


def button(text: str, secondary: bool = False, margin: tuple = (0, 0, 0, 0), display: str = "inline-block",
           **kw) -> Node:
    pad = (6, 25, 6, 25) if secondary else (1, 6, 1, 6)
    style = Style(display=display, font=CONTROL_FONT, padding=pad, border=(2, 2, 2, 2), margin=margin)
    node = Node("button", classes="secondary-action" if secondary else kw.pop("classes", ""), style=style, **kw)
    node.append(text)
    return node


def text_input(width: float = 120, margin: tuple = (0, 0, 0, 0), display: str = "inline-block",
               input_type: str = "text", **kw) -> Node:
    style = Style(display=display, font=CONTROL_FONT, width=width, padding=(1, 2, 1, 2), border=(2, 2, 2, 2),
                  margin=margin)
    return Node("input", input_type=input_type, style=style, **kw)


def checkbox(width: float = 13, **kw) -> Node:
    style = Style(display="inline-block", width=width, height=13, margin=(3, 3, 3, 4))
    return Node("input", input_type="checkbox", style=style, **kw)


def set_margin(node: Node, top: float | None = None, left: float | None = None) -> None:
    """An inline ``style="margin-left: ..; margin-top: .."`` attribute (replacing the previous one)."""
    node.restyle(margin=(top or 0, 0, 0, left or 0))
