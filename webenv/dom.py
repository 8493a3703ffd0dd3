"""The mirror's small DOM: nodes, focus, click and key events, and ``core.getDOMInfo`` ported.

A task builds a page the way its MiniWoB++ HTML does (the same elements in the same order, the same
styles that matter for layout); the layout (``layout.py``) gives every node its box; ``Page.observe``
flattens the tree into the element list exactly as ``core.getDOMInfo`` and ``miniwob.dom.DOMElement``
do: elements with a zero-size box are skipped, refs are handed out in document order the first time an
element is seen in the episode, text-only elements carry their text, and the text nodes of mixed
elements become ``t`` fragments (one per line box) with fresh negative refs at every observation.

Event semantics follow what ``core.elementClick`` (``element.click(); element.focus()``) and WebDriver
keystrokes do in Chromium: a click bubbles to the root, marks its target "tampered" (with the episode
id in force after the handlers ran, so the click that ends an episode marks the element for the next),
toggles a checkbox, and on a label focuses and clicks the labelled control; ``focus()`` moves focus only
to focusable, displayed elements, and gives up if a blur handler hides the target; a typed character
fires ``keydown`` and goes to the focused element (appended to a text field; a space toggles a focused
checkbox or presses a focused button). Tasks hang their page's scripts on these events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from .fonts import Font
from .observation import Element, Observation

Box = tuple[float, float, float, float]  # left, top, width, height (CSS px)
Edges = tuple[float, float, float, float]  # top, right, bottom, left


@dataclass
class Style:
    """The resolved CSS a node needs for layout (no cascade: tasks set what their stylesheets set)."""

    display: str = "block"  # block | inline | inline-block | none
    font: Font | None = None  # None: inherit
    width: float | None = None  # content box
    height: float | None = None
    margin: Edges = (0, 0, 0, 0)
    padding: Edges = (0, 0, 0, 0)
    border: Edges = (0, 0, 0, 0)
    absolute: tuple[float, float | None] | None = None  # (left, top); top None = static position
    float_left: bool = False  # shrink-to-fit columns side by side; what follows clears them


@dataclass(eq=False)
class Text:
    data: str
    parent: Node | None = None
    # layout output: one (start, end, left, top, width, height) per line box, indices into data
    fragments: list[tuple[int, int, float, float, float, float]] = field(default_factory=list)


@dataclass(eq=False)
class Event:
    type: str
    target: Node
    key: str = ""


Handler = Callable[[Event], None]


@dataclass(eq=False)
class Node:
    tag: str
    id: str = ""
    classes: str = ""
    style: Style = field(default_factory=Style)
    children: list[Node | Text] = field(default_factory=list)
    parent: Node | None = None
    input_type: str | None = None  # for <input>: "text", "checkbox", "password"
    value: str = ""
    checked: bool = False
    tabindex: int | None = None
    href: str | None = None
    label_for: Node | None = None  # a <label>'s control (its ``for`` target or the input inside)
    handlers: dict[str, list[Handler]] = field(default_factory=dict)
    # per-episode bookkeeping, as core.js keeps it in data-wob_ref and data-tampered
    ref: int | None = None
    tampered_in: int | None = None  # the WOB_EPISODE_ID in force when the element was last clicked
    box: Box | None = None  # border box from the layout; None or zero size: not rendered
    page: Page | None = field(default=None, repr=False)  # set on <body> only

    # --- tree -----------------------------------------------------------------------------
    def append(self, *kids: Node | Text | str) -> Node:
        for kid in kids:
            if isinstance(kid, str):
                kid = Text(kid)
            kid.parent = self
            self.children.append(kid)
        self._touch()
        return self

    def clear(self) -> None:
        for kid in self.children:
            kid.parent = None
        self.children = []
        self._touch()

    def restyle(self, **changes) -> None:
        """Change style properties (and so the layout): ``node.restyle(display="none")``."""
        self.style = replace(self.style, **changes)
        self._touch()

    def _touch(self) -> None:
        """Tell the page its layout is stale (only tree and style changes move boxes)."""
        node = self
        while node.parent is not None:
            node = node.parent
        if node.page is not None:
            node.page.dirty = True

    def walk(self) -> Iterator[Node]:
        yield self
        for kid in self.children:
            if isinstance(kid, Node):
                yield from kid.walk()

    @property
    def text_content(self) -> str:
        return "".join(k.data if isinstance(k, Text) else k.text_content for k in self.children)

    def on(self, kind: str, handler: Handler) -> Node:
        """Add an event listener (``click``, ``focus``, ``blur``, ``input``)."""
        self.handlers.setdefault(kind, []).append(handler)
        return self

    def off(self, kind: str) -> None:
        self.handlers.pop(kind, None)

    def add_class(self, *names: str) -> None:
        """jQuery's ``addClass``: missing names are appended, in order."""
        have = self.classes.split()
        self.classes = " ".join(have + [n for n in names if n not in have])

    def remove_class(self, *names: str) -> None:
        self.classes = " ".join(c for c in self.classes.split() if c not in names)

    @property
    def rendered(self) -> bool:
        return self.box is not None and self.box[2] > 0 and self.box[3] > 0

    @property
    def displayed(self) -> bool:
        """In the document and not under ``display: none`` (so it has a layout object)."""
        node: Node | None = self
        while node is not None:
            if node.style.display == "none":
                return False
            if node.parent is None:
                return node.tag == "body"
            node = node.parent
        return False

    @property
    def focusable(self) -> bool:
        if not self.displayed:
            return False
        if self.tag in ("input", "button", "textarea", "select"):
            return True
        return (self.tag == "a" and self.href is not None) or self.tabindex is not None

    @property
    def dom_tag(self) -> str:
        return f"{self.tag}_{self.input_type}" if self.tag == "input" else self.tag


class EpisodeOver(Exception):
    """Raised inside event dispatch once a handler has ended the episode (nothing more happens)."""


class Page:
    """One task page: the body, the instruction, focus, refs, and the episode's end."""

    #: ids core.getDOMInfo never reports (the instruction is reported as the utterance instead)
    SKIPPED_IDS = frozenset({"reward-display", "sync-task-cover", "click-canvas", "query"})

    def __init__(self, body: Node, layout: Callable[[Page], None]):
        self.body = body
        body.page = self
        self._layout = layout
        self.dirty = True  # the layout must be (re)computed before the next observation
        self.query = ""
        self.active: Node | None = None  # document.activeElement; None means the body
        self.next_ref = 1
        self.next_text_ref = -1
        self.previous: dict[int, Node] = {}  # core.previousDOMInfo: refs of the last observation
        self.done = True  # no episode runs until the first reset
        self.raw_reward = 0.0
        self.episode_id = 0  # WOB_EPISODE_ID: counts ended episodes
        self.timers: list[Callable[[], None]] = []  # pending setTimeout callbacks, run on settle()
        self.layout_hooks: list[Callable[[Page], None]] = []

    # --- episode ---------------------------------------------------------------------------
    def end_episode(self, reward: float) -> None:
        """``core.endEpisode``: only the first call of an episode counts."""
        if not self.done:
            self.done = True
            self.raw_reward = float(reward)
            self.episode_id += 1
        raise EpisodeOver

    def start_episode(self) -> None:
        """What miniwob's reset does before ``genProblem``: end a running episode with reward 0
        (``core.endEpisode(0)``), then start afresh (``core.startEpisodeReal``)."""
        if not self.done:
            self.done = True
            self.episode_id += 1
        self.timers.clear()
        for node in self.body.walk():
            node.ref = None
        self.next_ref, self.next_text_ref = 1, -1
        self.done, self.raw_reward = False, 0.0

    def tampered(self, node: Node) -> bool:
        """``data-tampered == 'e' + WOB_EPISODE_ID``: clicked during this episode."""
        return node.tampered_in == self.episode_id

    def settle(self) -> None:
        """Run the callbacks tasks scheduled with a delay (the real backend waits for them too)."""
        while self.timers and not self.done:
            try:
                self.timers.pop(0)()
            except EpisodeOver:
                pass
        self.timers.clear()

    # --- events ----------------------------------------------------------------------------
    def _fire(self, kind: str, target: Node, bubbles: bool, key: str = "") -> None:
        event = Event(kind, target, key)
        node: Node | None = target
        while node is not None:
            for handler in list(node.handlers.get(kind, ())):
                handler(event)
            node = node.parent if bubbles else None

    def click(self, node: Node) -> None:
        """``element.click()``: the click event (bubbling) and the element's activation behaviour."""
        if node.tag == "input" and node.input_type in ("checkbox", "radio"):
            node.checked = not node.checked if node.input_type == "checkbox" else True
        try:
            self._fire("click", node, bubbles=True)
        finally:  # core.canvasDrawClick, a listener on <body>, marks the target last, even after the
            node.tampered_in = self.episode_id  # episode ended: then the mark carries into the next one
        control = node.label_for if node.tag == "label" else None
        if control is not None and control is not node:
            self.focus(control)
            self.click(control)

    def focus(self, node: Node) -> None:
        """``element.focus()``: moves focus to a focusable element: blur, focusout, focus, focusin."""
        if not node.focusable or self.active is node:
            return
        previous, self.active = self.active, None
        if previous is not None:
            self._fire("blur", previous, bubbles=False)
            self._fire("focusout", previous, bubbles=True)
            if self.active is not None or not node.focusable:  # a blur handler moved focus or hid
                return  # the element (Chromium's Document::SetFocusedElement gives up then)
        self.active = node
        self._fire("focus", node, bubbles=False)
        self._fire("focusin", node, bubbles=True)

    def blur(self, node: Node) -> None:
        if self.active is node:
            self.active = None
            self._fire("blur", node, bubbles=False)
            self._fire("focusout", node, bubbles=True)

    def key(self, char: str) -> None:
        """One printable character typed by WebDriver into the focused element."""
        node = self.active
        if node is None:
            return
        self._fire("keydown", node, bubbles=True, key=char)
        if node.tag == "input" and node.input_type in ("text", "password", None):
            node.value += char
            self._fire("input", node, bubbles=True, key=char)
        elif node.tag == "textarea":
            node.value += char
            self._fire("input", node, bubbles=True, key=char)
        elif char == " " and (node.tag == "button" or (node.tag == "input" and node.input_type == "checkbox")):
            self.click(node)

    def element_click(self, ref: int) -> bool:
        """``core.elementClick(ref)``: click then focus the element the last observation called ``ref``."""
        node = self.previous.get(ref)
        if node is None:
            return False
        self.click(node)
        self.focus(node)
        return True

    def run(self, action: Callable[[], None]) -> None:
        """Run one agent action, then let the page settle; stops where a handler ends the episode."""
        if self.done:
            return
        try:
            action()
        except EpisodeOver:
            return
        self.settle()

    # --- observation ---------------------------------------------------------------------------
    def observe(self, task: str) -> Observation:
        """``core.getDOMInfo`` + ``miniwob.dom.DOMElement``, flattened in document order."""
        if self.dirty:
            self._layout(self)
            self.dirty = False
        self.previous = {}
        out: list[Element] = []
        self._visit(self.body, 0, out)
        return Observation(task=task, utterance=" ".join(self.query.split()), elements=tuple(out))

    def _visit(self, node: Node, parent_ref: int, out: list) -> bool:
        if node.id in self.SKIPPED_IDS or not node.rendered:
            return False
        if node.ref is None:
            node.ref, self.next_ref = self.next_ref, self.next_ref + 1
        ref = node.ref
        self.previous[ref] = node
        kids = [k for k in node.children if type(k) is Node or k.data.strip()]
        if node.tag == "input":
            value = ("True" if node.checked else "") if node.input_type in ("checkbox", "radio") else node.value
        else:
            value = node.value if node.tag == "textarea" else ""
        here = len(out)
        out.append(None)  # this element, once its text is known
        if all(type(k) is Text for k in kids):
            text, leaf = " ".join(k.data.strip() for k in kids), True
        else:
            text, leaf, n_kids, fragments_only = "", False, 0, True
            for kid in kids:
                if type(kid) is Text:
                    for start, end, f_left, f_top, f_width, f_height in kid.fragments:
                        frag = kid.data[start:end].strip()
                        if f_width > 0 and f_height > 0 and frag:
                            out.append(Element(self.next_text_ref, ref, "t", frag, "", "", "", f_left, f_top,
                                               f_width, f_height, False, False, True))
                            self.next_text_ref -= 1
                            n_kids += 1
                elif self._visit(kid, ref, out):
                    n_kids += 1
                    fragments_only = False
            if n_kids and fragments_only:  # DOMElement: children that are all "t" fold into the text
                text, leaf = " ".join(el.text for el in out[here + 1 :]), True
                del out[here + 1 :]
        left, top, width, height = node.box
        focused = self.active is node or (self.active is None and node is self.body)
        out[here] = Element(ref, parent_ref, node.dom_tag, text, value, node.id, node.classes, left, top, width,
                            height, focused, self.tampered(node), leaf)
        return True


