"""The mirrored MiniWoB++ tasks, each a port of its HTML file's ``genProblem()``.

Every task builds its page once (as the HTML file does) and regenerates the problem for each seed
exactly as the browser does after ``Math.seedrandom(seed)``: the same calls to ``Math.random`` in the
same order (``seedrandom.py``), the same word lists (``words.py``), the same elements in the same
order. Beside the port, each task has an **oracle** (observation → the action strings that solve the
episode from this observation; a task that hides its answer plans a step at a time) and a **progress** score in [0, 1] after each step (partial credit,
later a process reward). Both read only observations, so they work the same on either backend.

``TASKS`` maps a task name to its class. Which tasks the study calls mastered and headroom is its design
(:data:`graftkit.study.design.SUITES`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import ClassVar

from ..core.env import Prompt
from .dom import Event, Node, Page, Style
from .fonts import Font, ceil64
from .html import (
    AREA_FONT,
    br,
    button,
    checkbox,
    div,
    label,
    page_skeleton,
    set_margin,
    span,
    text_input,
    ws,
)
from .observation import Element, Observation
from .render import render_text, web_prompt
from .seedrandom import SeedRandom
from .words import ui_utils


# --- ui_utils.js helpers ---------------------------------------------------------------------------

def txt_capitalize(s: str) -> str:
    return s[:1].upper() + s[1:]


def generate_words(rng: SeedRandom, min_words: int, max_words: int | None = None) -> str:
    """``ui_utils.generateWords``."""
    lorem = ui_utils()["lorem_words"]
    max_words = min_words if max_words is None else max_words
    first, txt = True, ""
    n = rng.randi(min_words, max_words)
    for i in range(n):
        w = lorem[rng.randi(0, len(lorem))]
        if first:
            w, first = txt_capitalize(w), False
        if rng.random() < 0.2 and (i + 1) < n:
            txt += w + ". "
            first = True
        elif i + 1 == n:
            txt += w.replace(",", "", 1)
        else:
            txt += w + " "
    return txt + "."


def generate_string(rng: SeedRandom, min_chars: int, max_chars: int | None = None) -> str:
    """``ui_utils.generateString``."""
    chars = ui_utils()["alphanumericChars"]
    max_chars = min_chars if max_chars is None else max_chars
    return "".join(rng.sample(chars) for _ in range(rng.randi(min_chars, max_chars)))


def append_linked(parent: Node, words: list[str], links: list[bool]) -> list[Node]:
    """``words.join(' ')`` appended to ``parent`` with each marked word a ``<span class="alink">`` (text
    between links as text nodes, as the browser parses the joined HTML); returns the spans."""
    pending, spans = "", []
    for j, (w, is_link) in enumerate(zip(words, links)):
        sep = " " if j else ""
        if is_link:
            if pending + sep:
                parent.append(pending + sep)
            node = span(w, classes="alink")
            parent.append(node)
            spans.append(node)
            pending = ""
        else:
            pending += sep + w
    if pending:
        parent.append(pending)
    return spans


# --- observation helpers (oracles and progress read only these) --------------------------------------

def _quoted(utterance: str) -> list[str]:
    return re.findall(r'"([^"]*)"', utterance)


def _first(obs: Observation, pred: Callable[[Element], bool]) -> Element | None:
    return next((el for el in obs.elements if pred(el)), None)


def _submit(obs: Observation, text: str = "Submit") -> Element | None:
    return _first(obs, lambda el: el.tag == "button" and el.text == text)


def typed_fraction(value: str, target: str) -> float:
    """How much of ``target`` a field holds: its correct prefix, and nothing once it went wrong."""
    if not target:
        return 1.0 if not value else 0.0
    return len(value) / len(target) if target.startswith(value) else 0.0


def quote(text: str) -> str:
    """A string literal for an action: ``"`` and ``\\`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# --- the task protocol --------------------------------------------------------------------------------

class Task:
    """One MiniWoB++ task: its page, its problem generator, an oracle and a progress score."""

    name: ClassVar[str]
    max_steps: ClassVar[int] = 4
    #: also runs in the real backend (a port of a MiniWoB++ file), or mirror-only
    in_miniwob: ClassVar[bool] = True
    #: ms of page timers a typed character starts (the real backend waits them out; the mirror settles)
    settle_ms: ClassVar[int] = 0
    # the episode protocol's kind plumbing (graftkit.core.env.EpisodeSpec)
    kind: ClassVar[str] = "web"
    reads: ClassVar[str] = "action"
    screenshots: ClassVar[bool] = True
    demo_pool: ClassVar[int] = 400
    items: ClassVar[int | None] = None

    @staticmethod
    def prompt(obs: Observation, history: Sequence[str]) -> Prompt:
        """The turn's prompt (:func:`graftkit.webenv.render.web_prompt`)."""
        return web_prompt(render_text(obs), history)

    def __init__(self) -> None:
        self.page, self.area = self.build()
        self.page.layout_hooks.append(self.after_layout)

    def build(self) -> tuple[Page, Node]:
        return page_skeleton()

    def gen_problem(self, rng: SeedRandom) -> None:
        raise NotImplementedError

    def before_episode(self) -> None:
        """Tidy-up both backends do before a reset (see ``real.RESET_SCRIPT``); most tasks need none."""

    def after_layout(self, page: Page) -> None:
        """Runs after the flow layout: boxes it cannot produce (jQuery UI's floated tab strip) and
        positions scripts compute from other boxes (the autocomplete menu); most tasks need none."""

    # observation → actions / score
    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        raise NotImplementedError

    def demonstrate(self, obs: Observation) -> list[str]:
        """The demonstrator's plan from ``obs`` in the live episode: the oracle's, unless the task hides
        the answer from the observation and its demonstrator reads the page (click-tab-2)."""
        return self.oracle(obs)

    @staticmethod
    def partial(first: Observation, obs: Observation) -> float:
        """Partial credit in [0, 1) while the episode runs (0 for one-step tasks)."""
        return 0.0

    @staticmethod
    def ambiguous(first: Observation) -> bool:
        """True when the observation does not determine the answer (MiniWoB++ itself can generate such
        episodes); no oracle can be sure to solve them, so demonstrations skip them."""
        return False

    @classmethod
    def progress(cls, first: Observation, obs: Observation, raw_reward: float, done: bool) -> float:
        """Progress after a step: 1 on success, 0 on a failed end, else the task's partial credit."""
        if done:
            return 1.0 if raw_reward == 1.0 else 0.0
        return min(max(cls.partial(first, obs), 0.0), 0.99)

    # helpers for ports
    def end(self, reward: float) -> Callable[[Event], None]:
        return lambda event: self.page.end_episode(reward)


def _d3_on(node: Node, kind: str, handler: Callable[[Event], None]) -> None:
    """d3's ``selection.on(type, fn)`` replaces the previous listener of that type."""
    node.off(kind)
    node.on(kind, handler)


# --- click-button ---------------------------------------------------------------------------------------

class ClickButton(Task):
    name = "click-button"
    max_steps = 3
    BUTTONS = ("submit", "okay", "ok", "yes", "no", "cancel", "next", "previous")

    def gen_problem(self, rng: SeedRandom) -> None:
        lorem = ui_utils()["lorem_words"]
        area = self.area
        area.clear()
        num, elements = 6, []
        for i in range(num):
            u = rng.randf(0, 1)
            must_make_button = i == num - 1 and not elements
            if u < 0.33 and not must_make_button:
                area.append(div("".join(" " + rng.sample(lorem) for _ in range(3))))
            elif u < 0.66 and not must_make_button:
                if rng.randf(0, 1) < 0.5:
                    area.append(span("".join(" " + rng.sample(lorem) for _ in range(3)) + ": "))
                area.append(text_input(width=rng.randi(40, 150)), br())
            else:
                text = rng.sample(self.BUTTONS)
                if rng.randf(0, 1) < 0.5:
                    text = txt_capitalize(text)
                btn = button(text)
                area.append(btn)
                if rng.randf(0, 1) < 0.5:
                    area.append(br())
                elements.append(btn)
        correct = rng.sample(elements).text_content
        for btn in elements:
            btn.on("click", self.end(1.0 if btn.text_content == correct else -1.0))
        self.page.query = f'Click on the "{correct}" button.'

    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        (want,) = _quoted(obs.utterance)[:1]
        el = _first(obs, lambda e: e.tag == "button" and e.text == want)
        return [f"click({el.ref})"]


# --- click-link ---------------------------------------------------------------------------------------------

class ClickLink(Task):
    name = "click-link"
    max_steps = 3

    def gen_problem(self, rng: SeedRandom) -> None:
        area = self.area
        area.clear()
        while True:
            words = re.split(r"\s", generate_words(rng, 20))
            links = [rng.random() < 0.2 for _ in words]
            if any(links):
                break
        spans = append_linked(area, words, links)
        correct = spans[rng.randi(0, len(spans))].text_content
        for node in spans:
            node.on("click", self.end(1.0 if node.text_content == correct else -1.0))
        self.page.query = f'Click on the link "{correct}".'

    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        want = obs.utterance[len('Click on the link "'):-len('".')]
        el = _first(obs, lambda e: e.tag == "span" and "alink" in e.classes.split() and e.text == want)
        return [f"click({el.ref})"]


# --- enter-text -----------------------------------------------------------------------------------------------

class EnterText(Task):
    name = "enter-text"
    max_steps = 4

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        self.form = div(id="form")
        self.tt = text_input(id="tt")
        self.subbtn = button("Submit", secondary=True, id="subbtn")
        self.form.append(ws("\n      "), self.tt, ws("\n      "), self.subbtn, ws("\n    "))
        area.append(ws("\n    "), self.form, ws("\n  "))
        return page, area

    def gen_problem(self, rng: SeedRandom) -> None:
        self.tt.value = ""
        set_margin(self.form, left=rng.randi(0, 20), top=rng.randi(0, 20))
        set_margin(self.subbtn, top=rng.randi(0, 20))
        q = rng.sample(ui_utils()["FIFTY_NAMES"])
        self.page.query = f'Enter "{q}" into the text field and press Submit.'
        _d3_on(self.subbtn, "click", lambda event: self.page.end_episode(1.0 if self.tt.value == q else -1.0))

    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        (want,) = _quoted(obs.utterance)[:1]
        field = _first(obs, lambda e: e.tag == "input_text")
        return [f"type({field.ref}, {quote(want)})", f"click({_submit(obs).ref})"]

    @staticmethod
    def partial(first: Observation, obs: Observation) -> float:
        (want,) = _quoted(first.utterance)[:1]
        field = _first(obs, lambda e: e.tag == "input_text")
        return 0.5 * typed_fraction(field.value, want) if field else 0.0


# --- focus-text -------------------------------------------------------------------------------------------------

class FocusText(Task):
    name = "focus-text"
    max_steps = 3

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        self.tt = text_input(id="tt")
        area.append(ws("\n    "), self.tt, ws("\n  "))
        return page, area

    def gen_problem(self, rng: SeedRandom) -> None:
        self.tt.value = ""
        left = rng.randi(0, 20)
        set_margin(self.tt, left=left, top=rng.randi(0, 140))
        self.page.query = "Focus into the textbox."

        def on_focus(event: Event) -> None:
            self.page.blur(self.tt)
            self.page.end_episode(1.0)

        _d3_on(self.tt, "focus", on_focus)

    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        return [f"click({_first(obs, lambda e: e.tag == 'input_text').ref})"]


# --- focus-text-2 --------------------------------------------------------------------------------------------

class FocusText2(Task):
    name = "focus-text-2"
    max_steps = 3
    POS = ("1st", "2nd", "3rd")

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        self.boxes = [text_input(display="block", id=f"tt{i + 1}") for i in range(3)]
        for tt in self.boxes:
            area.append(ws("\n    "), tt)
        area.append(ws("\n  "))
        return page, area

    def gen_problem(self, rng: SeedRandom) -> None:
        for tt in self.boxes:
            tt.value = ""
            left = rng.randi(5, 20)
            set_margin(tt, left=left, top=rng.randi(5, 30))
        correct = rng.randi(0, 3)
        self.page.query = f"Focus into the {self.POS[correct]} input textbox."

        def on_focus(event: Event, i: int) -> None:
            self.page.blur(self.boxes[i])
            self.page.end_episode(1.0 if i == correct else -1.0)

        for i, tt in enumerate(self.boxes):
            _d3_on(tt, "focus", lambda event, i=i: on_focus(event, i))

    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        k = FocusText2.POS.index(obs.utterance.split()[3])
        return [f"click({[e for e in obs.elements if e.tag == 'input_text'][k].ref})"]


# --- click-checkboxes ---------------------------------------------------------------------------------------------

class ClickCheckboxes(Task):
    name = "click-checkboxes"
    max_steps = 8

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        self.boxes = div(id="boxes")
        self.subbtn = button("Submit", secondary=True, id="subbtn")
        area.append(ws("\n    "), self.boxes, ws("\n    "), br(), ws("\n    "), self.subbtn, ws("\n  "))
        return page, area

    def make_checkbox(self, parent: Node, i: int, name: str) -> Node:
        box = checkbox(width=20, id=f"ch{i}")
        parent.append(label(control=box).append(box, name), br())
        return box

    def gen_problem(self, rng: SeedRandom) -> None:
        self.boxes.clear()
        elems = rng.randi(2, 7)
        boxes, toclick, names = [], [], []
        for i in range(elems):
            name = generate_string(rng, 2, 8)
            boxes.append(self.make_checkbox(self.boxes, i, name))
            toclick.append(False)
            if rng.randf(0, 1) < 0.5:
                toclick[i] = True
                names.append(name)
        self.page.query = f"Select {', '.join(names) or 'nothing'} and click Submit."
        self.bind_submit(boxes, toclick)

    def bind_submit(self, boxes: list[Node], toclick: list[bool]) -> None:
        def on_submit(event: Event) -> None:
            r = sum(1.0 if box.checked == want else -1.0 for box, want in zip(boxes, toclick))
            self.page.end_episode(r / len(boxes))

        _d3_on(self.subbtn, "click", on_submit)

    @staticmethod
    def _targets(first: Observation) -> list[str]:
        m = re.fullmatch(r"Select (.*) and click Submit\.", first.utterance)
        listed = m.group(1) if m else ""
        return [] if listed == "nothing" else listed.split(", ")

    @staticmethod
    def _checkboxes(obs: Observation) -> list[tuple[Element, str]]:
        """Each checkbox with the text of its label (the ``t`` fragment beside it)."""
        out = []
        for i, el in enumerate(obs.elements):
            if el.tag == "input_checkbox":
                text = next((t.text for t in obs.elements[i + 1 :] if t.tag == "t" and t.parent == el.parent), "")
                out.append((el, text))
        return out

    @classmethod
    def ambiguous(cls, first: Observation) -> bool:
        """Two boxes share a label, and only some of that label's boxes are wanted: which, the page hides."""
        labels = [text for _, text in cls._checkboxes(first)]
        wanted = cls._targets(first)
        return any(labels.count(t) > 1 and 0 < wanted.count(t) < labels.count(t) for t in set(labels))

    @classmethod
    def oracle(cls, obs: Observation) -> list[str]:
        wanted = cls._targets(obs)
        actions = []
        for box, text in cls._checkboxes(obs):
            if text in wanted:
                wanted.remove(text)
                if not box.checked:
                    actions.append(f"click({box.ref})")
        return actions + [f"click({_submit(obs).ref})"]

    @classmethod
    def partial(cls, first: Observation, obs: Observation) -> float:
        wanted = cls._targets(first)
        good = bad = 0
        for box, text in cls._checkboxes(obs):
            if text in wanted:
                wanted.remove(text)
                good += box.checked
            else:
                bad += box.checked
        need = len(cls._targets(first))
        return max(good - bad, 0) / (need + 1)


# --- click-tab ------------------------------------------------------------------------------------------------------

class ClickTab(Task):
    """jQuery UI tabs; their floated tab strip gets its boxes in ``after_layout`` (constants measured in
    Chromium), the panels and paragraphs come from the flow layout."""

    name = "click-tab"
    max_steps = 3

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton(area_classes="ui-tabs ui-corner-all ui-widget ui-widget-content")
        area.restyle(border=(1, 1, 1, 1))
        return page, area

    def gen_problem(self, rng: SeedRandom) -> None:
        self.area.clear()
        self._strip()
        for i in range(3):
            self._panel(i, Node("p", style=Style(margin=(10, 0, 10, 0))).append(generate_words(rng, 20)))
        expected = rng.randi(1, 4)
        if expected == 2:
            active = 0
        elif expected == 3:
            active = rng.sample([0, 1])
        else:
            active = rng.sample([1, 2])
        self.page.query = f"Click on Tab #{expected}."
        self.activate(active)
        for i, (li, a) in enumerate(self.tabs):
            a.on("click", self.end(1.0 if i + 1 == expected else -1.0))
            # jQuery UI's _focusable(tabs) and _tabKeydown: a focused tab shows ui-state-focus, and
            # Space on it activates it (without clicking its anchor, so the episode goes on)
            li.on("focusin", lambda event, li=li: li.add_class("ui-state-focus"))
            li.on("focusout", lambda event, li=li: li.remove_class("ui-state-focus"))
            li.on("keydown", lambda event, i=i: self.activate(i) if event.key == " " else None)

    def _strip(self) -> None:
        """The tab strip (jQuery UI's markup for the three anchors), appended to the emptied area."""
        self.ul = Node("ul", classes="ui-tabs-nav ui-corner-all ui-helper-reset ui-helper-clearfix ui-widget-header",
                       style=Style(border=(1, 1, 1, 1), padding=(2, 2, 0, 2), height=25))
        self.tabs, self.panels = [], []
        for i in range(3):
            a = Node("a", id=f"ui-id-{i + 1}", classes="ui-tabs-anchor", href=f"#tabs-{i + 1}", tabindex=-1,
                     style=Style(display="inline-block"))
            a.append(f"Tab #{i + 1}")
            li = Node("li", classes="ui-tabs-tab ui-corner-top ui-state-default ui-tab", tabindex=-1,
                      style=Style(display="inline-block"))
            li.append(a)
            self.ul.append(li)
            self.tabs.append((li, a))
        self.area.append(ws("\n"), self.ul)

    def _panel(self, i: int, p: Node) -> None:
        """Tab ``i``'s panel holding ``p``, appended to the area."""
        panel = Node("div", id=f"tabs-{i + 1}", classes="ui-tabs-panel ui-corner-bottom ui-widget-content",
                     style=Style(margin=(2, 2, 2, 2), padding=(10, 14, 10, 14)))
        self.panels.append(panel.append(p))
        self.area.append(panel)

    def activate(self, k: int) -> None:
        """``_activate(k)``: the old tab loses the active classes, then the new one gains them."""
        for i, ((li, a), panel) in enumerate(zip(self.tabs, self.panels)):
            if i != k:
                li.remove_class("ui-tabs-active", "ui-state-active")
                panel.restyle(display="none")
        li, _ = self.tabs[k]
        li.add_class("ui-tabs-active", "ui-state-active")
        li.tabindex = 0
        self.panels[k].restyle(display="block")

    def after_layout(self, page: Page) -> None:
        left, top = self.ul.box[0], self.ul.box[1]
        for i, (li, a) in enumerate(self.tabs):
            active = "ui-tabs-active" in li.classes
            li.box = (left + 3 + 44 * i, top + 4, 42.0, 25.0 if active else 24.0)
            a.box = (left + 4 + 44 * i, top + 5, 10 + ceil64(AREA_FONT.width(a.text_content)), 23.0)
            a.children[0].fragments = []

    @staticmethod
    def oracle(obs: Observation) -> list[str]:
        want = obs.utterance[len("Click on "):-1]
        return [f"click({_first(obs, lambda e: e.tag == 'a' and e.text == want).ref})"]


# --- click-tab-2 ----------------------------------------------------------------------------------------------

class ClickTab2(ClickTab):
    """Three jQuery UI tabs of 20 words each, some words links; the link to click may sit in a tab that is
    not open, and the observation (``core.getDOMInfo``) lists only the open panel. Clicking a tab opens
    it (the episode goes on); clicking a link ends it. Partially observable: where the link is hidden,
    nothing on the page says which tab holds it, so an agent must search. :meth:`oracle` reads only the
    observation (it opens the tabs in order); :meth:`demonstrate`, the demonstrator, also reads the page
    and opens the tab that holds the link — a privileged expert, as a human who knows the page would be."""

    name = "click-tab-2"
    max_steps = 5

    def gen_problem(self, rng: SeedRandom) -> None:
        area = self.area
        while True:  # generateLinks: until some tab holds a link
            area.clear()
            self._strip()
            self.links: list[Node] = []
            for i in range(3):
                words = re.split(r"\s", generate_words(rng, 20))
                marks = [rng.random() < 0.2 for _ in words]
                p = Node("p", style=Style(margin=(10, 0, 10, 0)))
                self.links += append_linked(p, words, marks)
                self._panel(i, p)
            if self.links:
                break
        correct = self.links[rng.randi(0, len(self.links))].text_content
        self.target = correct
        for node in self.links:
            _d3_on(node, "click", self.end(1.0 if node.text_content == correct else -1.0))
        self.page.query = f'Switch between the tabs to find and click on the link "{correct}".'
        self.activate(0)
        for i, (li, a) in enumerate(self.tabs):
            a.on("click", lambda event, i=i: self.activate(i))
            li.on("focusin", lambda event, li=li: li.add_class("ui-state-focus"))
            li.on("focusout", lambda event, li=li: li.remove_class("ui-state-focus"))
            li.on("keydown", lambda event, i=i: self.activate(i) if event.key == " " else None)

    def activate(self, k: int) -> None:
        """jQuery UI's ``_eventHandler``: a click on the open tab does nothing."""
        li, _ = self.tabs[k]
        if "ui-tabs-active" not in li.classes:
            super().activate(k)

    @staticmethod
    def _link(obs: Observation) -> Element | None:
        want = _quoted(obs.utterance)[-1]
        return _first(obs, lambda e: e.tag == "span" and "alink" in e.classes.split() and e.text == want)

    @classmethod
    def oracle(cls, obs: Observation) -> list[str]:
        """The link where it is shown, else the next tab after the open one (one step: the episode then
        shows what the tab holds, and the oracle plans again from there)."""
        link = cls._link(obs)
        if link is not None:
            return [f"click({link.ref})"]
        tabs = [e for e in obs.elements if e.tag == "a" and e.text.startswith("Tab #")]
        lis = {e.ref: e for e in obs.elements if e.tag == "li"}
        open_ = next(i for i, a in enumerate(tabs) if "ui-tabs-active" in lis[a.parent].classes.split())
        return [f"click({tabs[(open_ + 1) % len(tabs)].ref})"]

    def demonstrate(self, obs: Observation) -> list[str]:
        link = self._link(obs)
        if link is not None:
            return [f"click({link.ref})"]
        holds = next(i for i, panel in enumerate(self.panels)
                     if any(n.text_content == self.target for n in self.links if _inside(n, panel)))
        tab = next(e for e in obs.elements if e.tag == "a" and e.text == f"Tab #{holds + 1}")
        return [f"click({tab.ref})"]


def _inside(node: Node, ancestor: Node) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


# --- use-autocomplete ------------------------------------------------------------------------------------------------

class Autocomplete:
    """jQuery UI 1.12 ``$.ui.autocomplete`` as use-autocomplete configures it (prefix match, 300 ms delay).

    Typing schedules a search (``page.timers``; the real backend waits the delay out); the search
    fills the menu (``<ul>`` appended to ``<body>``, one ``<li><div>label</div></li>`` per match, ids
    from jQuery UI's page-wide ``uniqueId`` counter) and appends a message to the live region; clicking
    an item sets the field and closes the menu; losing focus closes it and cancels a pending search.
    """

    MENU_WIDTH = 128  # _resizeMenu: max(ul outerWidth + 1, input outerWidth)
    ITEM_FONT = Font(14)

    def __init__(self, page: Page, field: Node, source: Callable[[str], list[str]], uuid: list[int]):
        self.page, self.field, self.source, self.uuid = page, field, source, uuid
        self.term: str | None = None
        self.menu = Node("ul", id=self._unique_id(), tabindex=0,
                         classes="ui-menu ui-widget ui-widget-content ui-autocomplete ui-front",
                         style=Style(display="none", absolute=(0, 0), width=self.MENU_WIDTH - 2,
                                     border=(1, 1, 1, 1), font=self.ITEM_FONT))
        self.live = Node("div", classes="ui-helper-hidden-accessible",
                         style=Style(absolute=(0, None), width=1, height=1, margin=(-1, -1, -1, -1)))
        page.body.append(self.menu, self.live)
        field.classes = "ui-autocomplete-input"
        field.on("input", lambda event: self._search_timeout())
        field.on("blur", lambda event: self._blur())
        self.menu.on("click", self._menu_click)

    def _unique_id(self) -> str:
        self.uuid[0] += 1
        return f"ui-id-{self.uuid[0]}"

    @property
    def menu_visible(self) -> bool:
        return self.menu.style.display != "none"

    def _search_timeout(self) -> None:
        self._cancel()
        self.page.timers.append(self._delayed_search)

    def _cancel(self) -> None:
        self.page.timers = [t for t in self.page.timers if t != self._delayed_search]

    def _delayed_search(self) -> None:
        value = self.field.value
        if self.term != value or not self.menu_visible:
            self.term = value
            if len(value) < 1:
                self._close()
                return
            self._response(self.source(value))

    def _response(self, items: list[str]) -> None:
        if items:
            self._suggest(items)
        else:
            self._close()
        n = len(items)
        message = (f"{n} result{' is' if n == 1 else 's are'} available, use up and down arrow keys to navigate."
                   if n else "No search results.")
        for old in self.live.children:
            if isinstance(old, Node):
                old.restyle(display="none")
        self.live.append(Node("div", style=Style(width=1)).append(message))

    def _suggest(self, items: list[str]) -> None:
        self.menu.clear()
        for item in items:
            wrapper = Node("div", classes="ui-menu-item-wrapper", tabindex=-1,
                           style=Style(padding=(3, 14, 3, 5.6))).append(item)
            li = Node("li", classes="ui-menu-item").append(wrapper)
            self.menu.append(li)
        for li in self.menu.children:  # menu.refresh(): ids in document order
            li.children[0].id = self._unique_id()
        self.menu.restyle(display="block")

    def position_menu(self) -> None:
        """``ul.position({my: "left top", at: "left bottom", of: input})``."""
        left, top, _, height = self.field.box
        self.menu.style.absolute = (left, top + height)

    def _close(self) -> None:
        if self.menu_visible:
            self.menu.restyle(display="none")

    def _blur(self) -> None:
        self._cancel()
        self._close()

    def _menu_click(self, event: Event) -> None:
        li = event.target
        while li is not None and li is not self.menu and li.tag != "li":
            li = li.parent
        if li is None or li is self.menu:
            return
        if self.page.active is not self.field:
            self.page.focus(self.field)
        self.field.value = li.text_content
        self.term = self.field.value
        self._cancel()
        self._close()


class UseAutocomplete(Task):
    name = "use-autocomplete"
    max_steps = 4
    settle_ms = 300  # jQuery UI autocomplete's default delay

    def __init__(self) -> None:
        self.uuid = [0]  # jQuery UI's uniqueId counter lives as long as the page
        self.widget: Autocomplete | None = None
        super().__init__()

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton(area_padding=10)
        self.tags = text_input(id="tags", display="block")
        self.subbtn = button("Submit", secondary=True, id="subbtn", display="block", margin=(5, 0, 0, 0))
        area.append(ws("\n    "), label("Tags: ", control=self.tags), ws("\n    "), self.tags, ws("\n    "),
                    self.subbtn, ws("\n  "))
        return page, area

    @staticmethod
    def matches(term: str) -> list[str]:
        t = term.lower()
        return [c for c in ui_utils()["COUNTRIES"] if c.lower().startswith(t)]

    def gen_problem(self, rng: SeedRandom) -> None:
        items = ui_utils()["COUNTRIES"]
        self.tags.value = ""
        if self.widget is None:
            self.widget = Autocomplete(self.page, self.tags, self.matches, self.uuid)
        gt = items[rng.randi(0, len(items))]
        f = gt[: rng.randi(2, 5)]
        ne = rng.randi(2, 5)
        e = gt[len(gt) - ne :]
        match_end = rng.randf(0, 1) < 0.75
        if match_end:
            self.page.query = f'Enter an item that starts with "{f}" and ends with "{e}".'
        else:
            self.page.query = f'Enter an item that starts with "{f}".'

        def on_submit(event: Event) -> None:
            entered = self.tags.value
            correct = entered.startswith(f) and (entered.endswith(e) or not match_end)
            self.page.end_episode(1.0 if correct else -1.0)

        _d3_on(self.subbtn, "click", on_submit)

    def before_episode(self) -> None:
        if self.widget is not None:
            self.widget.live.clear()

    def after_layout(self, page: Page) -> None:
        if self.widget is not None and self.widget.menu_visible:
            self.widget.position_menu()

    @staticmethod
    def _spec(utterance: str) -> tuple[str, str]:
        q = _quoted(utterance)
        return q[0], (q[1] if len(q) > 1 else "")

    @classmethod
    def candidates(cls, utterance: str) -> list[str]:
        f, e = cls._spec(utterance)
        return [c for c in ui_utils()["COUNTRIES"] if c.startswith(f) and c.endswith(e)]

    @classmethod
    def oracle(cls, obs: Observation) -> list[str]:
        field = _first(obs, lambda el: el.tag == "input_text")
        return [f"type({field.ref}, {quote(cls.candidates(obs.utterance)[0])})", f"click({_submit(obs).ref})"]

    @classmethod
    def partial(cls, first: Observation, obs: Observation) -> float:
        field = _first(obs, lambda el: el.tag == "input_text" and el.id == "tags")
        if field is None:
            return 0.0
        return 0.5 * max((typed_fraction(field.value, c) for c in cls.candidates(first.utterance)), default=0.0)


# --- headroom tasks: ports of harder MiniWoB++ tasks ---------------------------------------------------------

class ClickCheckboxesLarge(ClickCheckboxes):
    """click-checkboxes-large: 7–12 boxes in two floated columns, 5–12 of them to select."""

    name = "click-checkboxes-large"
    max_steps = 15

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        self.left = div(id="boxes-left", style=Style(float_left=True))
        self.right = div(id="boxes-right", style=Style(float_left=True))
        self.subbtn = button("Submit", secondary=True, id="subbtn")
        # the page's <br style="clear: both"> between the columns and the button is left out: it is
        # never reported, and Chromium gives its line no height
        area.append(ws("\n    "), self.left, ws("\n    "), self.right, ws("\n    "), self.subbtn, ws("\n  "))
        return page, area

    def gen_problem(self, rng: SeedRandom) -> None:
        self.left.clear()
        self.right.clear()
        num_to_click = rng.randi(5, 13)
        elems = rng.randi(max(7, num_to_click), 13)
        boxes, names = [], []
        for i in range(elems):
            column = self.left if i < elems / 2 else self.right
            name = generate_string(rng, 2, 8)
            boxes.append(self.make_checkbox(column, i, name))
            names.append((i, name))
        rng.shuffle(names)
        toclick = [False] * elems
        click_names = []
        for j, (i, name) in enumerate(names):
            if j < num_to_click:
                toclick[i] = True
                click_names.append(name)
        self.page.query = f"Select {', '.join(click_names) or 'nothing'} and click Submit."
        self.bind_submit(boxes, toclick)


class _FormTask(Task):
    """Tasks whose page is ``<div id="form">`` with ``<p><label>..</label><input></p>`` rows."""

    max_steps = 5
    ROWS: ClassVar[tuple[tuple[str, str, str, bool], ...]]  # (label, input id, input type, bold label)
    BUTTON: ClassVar[str] = "Submit"
    BUTTON_MARGIN: ClassVar[tuple] = (0, 0, 0, 0)

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        form = div(id="form")
        self.fields: dict[str, Node] = {}
        form.append(ws("\n      "))
        for text, field_id, kind, bold in self.ROWS:
            width = 120 if kind == "text" else 100  # core.css: #area input[type=text] { width: 120px }
            field = text_input(width=width, margin=(5, 5, 5, 5), input_type=kind, id=field_id)
            lab = label(text, classes="bold" if bold else "",
                        style=Style(display="inline", font=Font(10, bold=True) if bold else None))
            form.append(Node("p", style=Style(margin=(10, 0, 10, 0))).append(lab, field), ws("\n      "))
            self.fields[field_id] = field
        self.subbtn = button(self.BUTTON, secondary=True, id="subbtn", margin=self.BUTTON_MARGIN)
        form.append(self.subbtn, ws("\n    "))
        area.append(ws("\n    "), form, ws("\n  "))
        return page, area

    def clear_fields(self) -> None:
        for field in self.fields.values():
            field.value = ""

    @staticmethod
    def _field(obs: Observation, field_id: str) -> Element | None:
        return _first(obs, lambda el: el.id == field_id and el.tag.startswith("input_"))

    @classmethod
    def expected(cls, utterance: str) -> dict[str, str]:
        """What each field must hold, read from the instruction."""
        raise NotImplementedError

    @classmethod
    def oracle(cls, obs: Observation) -> list[str]:
        acts = [f"type({cls._field(obs, fid).ref}, {quote(text)})" for fid, text in cls.expected(obs.utterance).items()]
        return acts + [f"click({_submit(obs, cls.BUTTON).ref})"]

    @classmethod
    def partial(cls, first: Observation, obs: Observation) -> float:
        want = cls.expected(first.utterance)
        got = [typed_fraction(f.value if (f := cls._field(obs, fid)) else "", text) for fid, text in want.items()]
        return 0.8 * sum(got) / len(got)


class LoginUser(_FormTask):
    name = "login-user"
    ROWS = (("Username", "username", "text", True), ("Password", "password", "password", True))
    BUTTON = "Login"

    def gen_problem(self, rng: SeedRandom) -> None:
        self.clear_fields()
        user = rng.sample(ui_utils()["FIFTY_NAMES"]).lower()
        password = generate_string(rng, 2, 6)
        self.page.query = (f'Enter the username "{user}" and the password "{password}" into the text fields and '
                           "press login.")
        fields = self.fields

        def on_submit(event: Event) -> None:
            ok = fields["username"].value == user and fields["password"].value == password
            self.page.end_episode(1.0 if ok else -1.0)

        _d3_on(self.subbtn, "click", on_submit)

    @classmethod
    def expected(cls, utterance: str) -> dict[str, str]:
        user, password = _quoted(utterance)[:2]
        return {"username": user, "password": password}


class EnterPassword(_FormTask):
    name = "enter-password"
    ROWS = (("Password", "password", "password", False), ("Verify password", "verify", "password", False))
    BUTTON_MARGIN = (0, 7, 0, 7)

    def gen_problem(self, rng: SeedRandom) -> None:
        self.clear_fields()
        password = generate_string(rng, 2, 6)
        self.page.query = f'Enter the password "{password}" into both text fields and press submit.'
        fields = self.fields

        def on_submit(event: Event) -> None:
            ok = fields["password"].value == password and fields["verify"].value == password
            self.page.end_episode(1.0 if ok else -1.0)

        _d3_on(self.subbtn, "click", on_submit)

    @classmethod
    def expected(cls, utterance: str) -> dict[str, str]:
        (password,) = _quoted(utterance)[:1]
        return {"password": password, "verify": password}


class EnterText2(EnterText):
    """enter-text-2: type the name in the case the instruction asks for."""

    name = "enter-text-2"

    def gen_problem(self, rng: SeedRandom) -> None:
        self.tt.value = ""
        set_margin(self.form, left=rng.randi(0, 20), top=rng.randi(0, 20))
        set_margin(self.subbtn, top=rng.randi(0, 20))
        q = rng.sample(ui_utils()["FIFTY_NAMES"])
        if math.floor(rng.random() * 2) == 1:
            expected, q, how = q.upper(), q.lower(), "all upper case letters"
        else:
            expected, q, how = q.lower(), q.upper(), "all lower case letters"
        self.page.query = f'Type "{q}" in {how} in the text input and press Submit.'
        _d3_on(self.subbtn, "click", lambda event: self.page.end_episode(1.0 if self.tt.value == expected else -1.0))

    @staticmethod
    def _target(utterance: str) -> str:
        (q,) = _quoted(utterance)[:1]
        return q.upper() if "upper case" in utterance else q.lower()

    @classmethod
    def oracle(cls, obs: Observation) -> list[str]:
        field = _first(obs, lambda e: e.tag == "input_text")
        return [f"type({field.ref}, {quote(cls._target(obs.utterance))})", f"click({_submit(obs).ref})"]

    @classmethod
    def partial(cls, first: Observation, obs: Observation) -> float:
        field = _first(obs, lambda e: e.tag == "input_text")
        return 0.5 * typed_fraction(field.value, cls._target(first.utterance)) if field else 0.0


# --- headroom tasks that exist only in the mirror --------------------------------------------------------------

class EnterTextLong(EnterText):
    """Mirror-only: enter-text with a full name (first and last), a longer string to get right."""

    name = "enter-text-long"
    in_miniwob = False

    def gen_problem(self, rng: SeedRandom) -> None:
        self.tt.value = ""
        set_margin(self.form, left=rng.randi(0, 20), top=rng.randi(0, 20))
        set_margin(self.subbtn, top=rng.randi(0, 20))
        q = f"{rng.sample(ui_utils()['FIFTY_NAMES'])} {rng.sample(ui_utils()['LAST_NAMES'])}"
        self.page.query = f'Enter "{q}" into the text field and press Submit.'
        _d3_on(self.subbtn, "click", lambda event: self.page.end_episode(1.0 if self.tt.value == q else -1.0))


class FillForm(Task):
    """Mirror-only: a three-field form (first name, last name, country) and Submit — four steps."""

    name = "fill-form"
    in_miniwob = False
    max_steps = 6
    FIELDS = (("First name", "first"), ("Last name", "last"), ("Country", "country"))

    def build(self) -> tuple[Page, Node]:
        page, area = page_skeleton()
        form = div(id="form")
        self.fields = {}
        for text, field_id in self.FIELDS:
            field = text_input(width=90, id=field_id)
            lab = Node("label", label_for=field, style=Style(display="inline-block", width=50)).append(text)
            form.append(Node("div", classes="row", style=Style(margin=(3, 0, 3, 0))).append(lab, field))
            self.fields[field_id] = field
        self.subbtn = button("Submit", secondary=True, id="subbtn", margin=(3, 0, 0, 0))
        form.append(self.subbtn)
        area.append(form)
        return page, area

    def gen_problem(self, rng: SeedRandom) -> None:
        words = ui_utils()
        for field in self.fields.values():
            field.value = ""
        want = {"first": rng.sample(words["FIFTY_NAMES"]), "last": rng.sample(words["LAST_NAMES"]),
                "country": rng.sample(words["COUNTRIES"])}
        self.page.query = (f'Enter the first name "{want["first"]}", the last name "{want["last"]}" and the country '
                           f'"{want["country"]}" into the form and press Submit.')
        fields = self.fields
        _d3_on(self.subbtn, "click", lambda event: self.page.end_episode(
            1.0 if all(fields[k].value == v for k, v in want.items()) else -1.0))

    @staticmethod
    def expected(utterance: str) -> dict[str, str]:
        first, last, country = _quoted(utterance)[:3]
        return {"first": first, "last": last, "country": country}

    @classmethod
    def oracle(cls, obs: Observation) -> list[str]:
        acts = [f"type({_first(obs, lambda e, f=fid: e.id == f).ref}, {quote(v)})"
                for fid, v in cls.expected(obs.utterance).items()]
        return acts + [f"click({_submit(obs).ref})"]

    @classmethod
    def partial(cls, first: Observation, obs: Observation) -> float:
        got = []
        for fid, v in cls.expected(first.utterance).items():
            field = _first(obs, lambda e, f=fid: e.id == f)
            got.append(typed_fraction(field.value if field else "", v))
        return 0.8 * sum(got) / len(got)


# --- the registry -------------------------------------------------------------------------------------------------

TASKS: dict[str, type[Task]] = {
    cls.name: cls
    for cls in (ClickButton, ClickLink, EnterText, FocusText, FocusText2, ClickCheckboxes, ClickTab, ClickTab2,
                UseAutocomplete,
                ClickCheckboxesLarge, LoginUser, EnterPassword, EnterText2, EnterTextLong, FillForm)
}
