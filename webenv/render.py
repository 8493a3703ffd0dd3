"""Observation renderers shared by both backends: the text prompt and the Set-of-Marks screenshot.

A turn's prompt (:func:`web_prompt`) is the rendered page, the episode's earlier actions and ``action:``; with a
chat template the same text is the user message after :data:`SYSTEM`. The plain format::

    <observation text>
    previous: click(3) ; type(5, "Agustina")      (or "previous: none")
    action:

``render_text(obs)`` is a pure function of the observation's instruction and element list, so one
episode renders to the same text on the mirror and on the browser. One line per element worth acting
on or reading, in document order:

    Instruction: Select HF2 and click Submit.
    [6] input_checkbox "AU" unchecked
    [8] input_checkbox "HF2" unchecked
    [9] button "Submit"

- leaf elements and inputs get ``[ref] tag "text"``; an input inside a ``<label>`` takes the label's
  text as its name; text inputs show ``value="..."``, checkboxes ``checked``/``unchecked``, and the
  focused element ``focused``;
- text fragments (``t``, negative refs, not clickable) become ``text "..."`` lines, consecutive
  fragments of one parent joined, so how a paragraph wraps does not change the text;
- containers (body, divs holding other elements, list items around links) and visually hidden
  elements (under 2 px wide or high, e.g. jQuery UI's screen-reader live region) are left out.

``render_som(obs)`` draws Set-of-Marks the way BrowserGym does: interactive elements (inputs, buttons,
links, selects, options, list items, table cells, and what MiniWoB++ makes clickable with a listener —
``span.alink`` links and jQuery UI menu items, recognised by class since neither backend reports
listeners), the innermost one winning when they nest, at least 20 px² of area and inside the screen,
each with a box and its ref at the top-left corner. It draws over the
browser's screenshot when the observation carries one, and over a deterministic drawing of the element
boxes (``draw_layout``) for the mirror.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.env import Prompt
from .observation import Element, Observation

#: The system message of a web turn's prompt (with a chat template).
SYSTEM = "You operate a web page. Answer with one action: click(REF) or type(REF, \"TEXT\")."


def format_prompt(observation_text: str, history: Sequence[str]) -> str:
    """The plain prompt for one turn (see the module docstring)."""
    previous = " ; ".join(history) if history else "none"
    return f"{observation_text}\nprevious: {previous}\naction:"


def web_prompt(observation_text: str, history: Sequence[str]) -> Prompt:
    """The prompt of a web turn: the rendered page (:func:`render_text`) and the earlier actions, after
    :data:`SYSTEM` in a chat."""
    text = format_prompt(observation_text, history)
    return Prompt(({"role": "system", "content": SYSTEM}, {"role": "user", "content": text}), text)

SCREEN_W, SCREEN_H = 160, 210  # miniwob's TASK_WIDTH x TASK_HEIGHT screenshot crop
MIN_VISIBLE = 2.0
INTERACTIVE_TAGS = frozenset({"button", "a", "select", "option", "li", "td", "textarea"})
CLICKABLE_CLASSES = frozenset({"alink", "ui-menu-item-wrapper"})
MIN_MARK_AREA = 20.0


# --- text ---------------------------------------------------------------------------------------------------

def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _visible(el: Element) -> bool:
    return el.width >= MIN_VISIBLE and el.height >= MIN_VISIBLE


def render_elements(obs: Observation) -> list[str]:
    """The element lines of ``render_text`` (without the instruction)."""
    children: dict[int, list[Element]] = {}
    for el in obs.elements:
        children.setdefault(el.parent, []).append(el)
    hidden: set[int] = set()
    for el in obs.elements:  # hidden elements hide their subtrees
        if not _visible(el) or el.parent in hidden:
            hidden.add(el.ref)
    labelled: dict[int, str] = {}  # input ref -> text of the <label> around it
    folded: set[int] = set()  # elements whose text fragments are shown on another line
    for el in obs.elements:
        if el.tag in ("a", "button", "label") and not el.is_leaf:
            kids = children.get(el.ref, [])
            inputs = [k for k in kids if k.tag.startswith("input_")]
            folded.add(el.ref)
            if el.tag == "label" and inputs:
                labelled[inputs[0].ref] = " ".join(k.text for k in kids if k.tag == "t")

    lines: list[str] = []
    run_parent, run_text = None, []

    def flush() -> None:
        nonlocal run_parent, run_text
        if run_text:
            lines.append(f"text {_q(' '.join(run_text))}")
        run_parent, run_text = None, []

    for el in obs.elements:
        if el.ref in hidden:
            continue
        if el.tag == "t":
            if el.parent in folded:
                continue
            if run_parent != el.parent:
                flush()
                run_parent = el.parent
            run_text.append(el.text)
            continue
        line = _element_line(el, labelled, children)
        if line is not None:
            flush()
            lines.append(line)
    flush()
    return lines


def _element_line(el: Element, labelled: dict[int, str], children: dict[int, list[Element]]) -> str | None:
    if el.tag.startswith("input_") or el.tag == "textarea":
        parts = [f"[{el.ref}] {el.tag}"]
        if el.ref in labelled:
            parts.append(_q(labelled[el.ref]))
        if el.tag in ("input_checkbox", "input_radio"):
            parts.append("checked" if el.checked else "unchecked")
        else:
            parts.append(f"value={_q(el.value)}")
    elif el.is_leaf:
        if not el.text and el.tag not in INTERACTIVE_TAGS | {"label"}:
            return None
        parts = [f"[{el.ref}] {el.tag}", _q(el.text)]
    elif el.tag in ("a", "button", "label"):  # clickable, with text split into fragments
        kids = children.get(el.ref, [])
        if any(k.tag.startswith("input_") for k in kids):
            return None  # a label around an input: the input carries its text
        parts = [f"[{el.ref}] {el.tag}", _q(" ".join(k.text for k in kids if k.tag == "t"))]
    else:
        return None
    if el.focused and el.tag != "body":
        parts.append("focused")
    return " ".join(parts)


def render_text(obs: Observation) -> str:
    """The text observation: the instruction, then one line per element (see the module docstring)."""
    return "\n".join([f"Instruction: {obs.utterance}", *render_elements(obs)])


# --- Set-of-Marks -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mark:
    ref: int
    box: tuple[float, float, float, float]  # left, top, width, height in page px


def is_interactive(el: Element) -> bool:
    return (el.tag.startswith("input_") or el.tag in INTERACTIVE_TAGS
            or bool(CLICKABLE_CLASSES.intersection(el.classes.split())))


def som_marks(obs: Observation) -> list[Mark]:
    """The elements Set-of-Marks numbers: interactive, innermost, ≥ 20 px², on the screen."""
    parent = {el.ref: el.parent for el in obs.elements}
    interactive = [el for el in obs.elements if el.ref > 0 and is_interactive(el)]
    has_interactive_descendant: set[int] = set()  # innermost wins: their ancestors get no mark
    for el in interactive:
        ref = el.parent
        while ref:
            has_interactive_descendant.add(ref)
            ref = parent.get(ref, 0)
    marks = []
    for el in interactive:
        if el.ref in has_interactive_descendant or el.area < MIN_MARK_AREA:
            continue
        if el.left >= SCREEN_W or el.top >= SCREEN_H or el.left + el.width <= 0 or el.top + el.height <= 0:
            continue
        marks.append(Mark(el.ref, (el.left, el.top, el.width, el.height)))
    return marks


PALETTE = [(230, 25, 75), (60, 180, 75), (0, 130, 200), (245, 130, 48), (145, 30, 180), (70, 240, 240),
           (240, 50, 230), (128, 128, 0), (0, 128, 128), (170, 110, 40)]


@lru_cache(maxsize=8)
def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def draw_layout(obs: Observation, scale: int = 1):
    """A deterministic picture of the page from the element boxes alone (the mirror's "screenshot")."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (SCREEN_W * scale, SCREEN_H * scale), (255, 255, 255))
    d = ImageDraw.Draw(img)
    s = scale

    def rect(el: Element, **kw) -> None:
        x0, y0 = el.left * s, el.top * s
        d.rectangle([x0, y0, x0 + max(el.width * s - 1, 0), y0 + max(el.height * s - 1, 0)], **kw)

    d.rectangle([0, 0, SCREEN_W * s - 1, 50 * s - 1], fill=(255, 255, 0))
    d.multiline_text((3 * s, 3 * s), _wrap(obs.utterance, 30), fill=(0, 0, 0), font=_font(8 * s))
    text_font = _font(9 * s)
    for el in obs.elements:
        if not _visible(el):
            continue
        if el.tag == "button":
            rect(el, fill=(239, 239, 239), outline=(118, 118, 118))
            d.text(((el.left + 6) * s, (el.top + 3) * s), el.text, fill=(0, 0, 0), font=text_font)
        elif el.tag in ("input_text", "input_password", "textarea"):
            rect(el, fill=(255, 255, 255), outline=(118, 118, 118))
            shown = el.value if el.tag != "input_password" else "•" * len(el.value)
            d.text(((el.left + 3) * s, (el.top + 4) * s), shown, fill=(0, 0, 0), font=text_font)
        elif el.tag in ("input_checkbox", "input_radio"):
            x0, y0 = (el.left + el.width / 2 - 6.5) * s, el.top * s
            d.rectangle([x0, y0, x0 + 13 * s - 1, y0 + 13 * s - 1], fill=(255, 255, 255), outline=(118, 118, 118))
            if el.checked:
                d.line([x0 + 3 * s, y0 + 7 * s, x0 + 6 * s, y0 + 10 * s, x0 + 10 * s, y0 + 3 * s],
                       fill=(0, 117, 255), width=max(s, 1) * 2)
        elif el.tag == "li" and "ui-tabs-tab" in el.classes:
            active = "ui-tabs-active" in el.classes
            rect(el, fill=(0, 127, 255) if active else (246, 246, 246), outline=(197, 197, 197))
        elif el.tag == "ul" and "ui-menu" in el.classes:
            rect(el, fill=(255, 255, 255), outline=(197, 197, 197))
        elif el.is_leaf and el.text:
            color = (0, 0, 255) if "alink" in el.classes.split() else (0, 0, 0)
            d.text((el.left * s, el.top * s), el.text, fill=color, font=text_font)
    return img


def _wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + ([line] if line else []))


def render_som(obs: Observation, scale: int = 2):
    """The Set-of-Marks image (PIL) and its marks: the browser's screenshot when ``obs`` has one,
    else ``draw_layout``; boxes and ref numbers drawn at ``scale`` times the page size."""
    from PIL import Image, ImageDraw

    if obs.screenshot is not None:
        img = Image.fromarray(np.asarray(obs.screenshot, dtype=np.uint8)).convert("RGB")
        img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    else:
        img = draw_layout(obs, scale)
    marks = som_marks(obs)
    d = ImageDraw.Draw(img)
    font = _font(7 * scale)
    for i, mark in enumerate(marks):
        color = PALETTE[i % len(PALETTE)]
        x, y, w, h = (v * scale for v in mark.box)
        d.rectangle([x, y, x + w - 1, y + h - 1], outline=color, width=max(1, scale // 2 + 1))
        label = str(mark.ref)
        tw, th = d.textbbox((0, 0), label, font=font)[2:]
        d.rectangle([x, y, x + tw + 2, y + th + 1], fill=color)
        d.text((x + 1, y), label, fill=(255, 255, 255), font=font)
    return img, marks
