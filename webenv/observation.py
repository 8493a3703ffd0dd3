"""What an agent sees, identical in shape for both backends: the instruction and a flat element list.

The element fields mirror the ``dom_elements`` of the ``miniwob`` package (``core.getDOMInfo`` in
``core/core.js``): positive refs for elements, numbered 1, 2, ... in document order the first time an
element is seen in an episode and kept for the episode; negative refs for text fragments (``t``), given
afresh at every observation (-1, -2, ... counting on through the episode); ``value`` is the string
``"True"`` or ``""`` for a checkbox; ``is_leaf`` means the element carries its own text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Element:
    """One entry of the flat element list."""

    ref: int
    parent: int  # ref of the parent element, 0 for the root
    tag: str  # lower-case tag; inputs carry their type ("input_text"); text fragments are "t"
    text: str
    value: str
    id: str
    classes: str
    left: float
    top: float
    width: float
    height: float
    focused: bool = False
    tampered: bool = False
    is_leaf: bool = False

    @property
    def checked(self) -> bool:
        return self.tag in ("input_checkbox", "input_radio") and self.value == "True"

    @property
    def area(self) -> float:
        return self.width * self.height


@dataclass(frozen=True)
class Observation:
    """The instruction and the element list; ``screenshot`` (H×W×3 uint8) only when a backend made one."""

    task: str
    utterance: str
    elements: tuple[Element, ...]
    screenshot: np.ndarray | None = field(default=None, compare=False, repr=False)

    def by_ref(self, ref: int) -> Element | None:
        for el in self.elements:
            if el.ref == ref:
                return el
        return None

    @property
    def empty(self) -> bool:
        """True for the empty observation a finished episode returns."""
        return not self.elements and not self.utterance


def empty_observation(task: str) -> Observation:
    return Observation(task=task, utterance="", elements=())
