"""Font metrics for the mirror's layout: Liberation Sans, the font Chromium draws ``font-family: Arial`` with.

MiniWoB++ pages set ``font-family: Arial``; on Debian, fontconfig resolves it to Liberation Sans, which
is metric-compatible with Arial. The mirror needs text widths to break lines where Chromium breaks them
(a text node that wraps becomes several ``t`` pseudo-elements, each with its own ref). The tables hold
advance widths and the font's kerning pairs in font units (2048 per em) for printable ASCII, read from
LiberationSans-Regular.ttf / -Bold.ttf (fonts-liberation 1.07.4, SIL Open Font License 1.1); Chromium
shapes a whole paragraph as one run, so kerning applies across element boundaries and spaces.

Horizontal arithmetic is Chromium's: each glyph advance (and kerning adjustment) is the font-unit value
scaled to the font size and rounded to 16.16 fixed point (HarfBuzz), and a text run's width is rounded
up to a LayoutUnit (1/64 px, ``ceil64``). Font sizes are what Skia draws with, in 1/64 px steps (a form
control's 13.33 px is 13.328125 px). Vertical metrics follow ``SimpleFontData``: ascent, descent and
line gap are each rounded to whole pixels, and ``line-height: normal`` is their sum. Measured against
Chromium on 565 strings: all widths agree at 10 and 14 px, 563 of 565 at 13.33 px (off by 1/64 px).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

UNITS_PER_EM = 2048
ASCENDER, DESCENDER, LINE_GAP = 1854, 434, 67

REGULAR_ADVANCE: tuple[int, ...] = (  # chr(32) .. chr(126)
    569, 569, 727, 1139, 1139, 1821, 1366, 391, 682, 682, 797, 1196, 569, 682, 569, 569,
    1139, 1139, 1139, 1139, 1139, 1139, 1139, 1139, 1139, 1139, 569, 569, 1196, 1196, 1196, 1139,
    2079, 1366, 1366, 1479, 1479, 1366, 1251, 1593, 1479, 569, 1024, 1366, 1139, 1706, 1479, 1593,
    1366, 1593, 1479, 1366, 1251, 1479, 1366, 1933, 1366, 1366, 1251, 569, 569, 569, 961, 1139,
    682, 1139, 1139, 1024, 1139, 1139, 569, 1139, 1139, 455, 455, 1024, 455, 1706, 1139, 1139,
    1139, 1139, 682, 1024, 569, 1139, 1024, 1479, 1024, 1024, 1024, 684, 532, 684, 1196,
)
REGULAR_KERN: dict[str, int] = {
    ' A': -113, ' T': -37, ' Y': -37, 'A ': -113, 'AT': -152, 'AV': -152, 'AW': -76, 'AY': -152,
    'Av': -37, 'Aw': -37, 'Ay': -37, 'F,': -227, 'F.': -227, 'FA': -113, 'L ': -76, 'LT': -152,
    'LV': -152, 'LW': -152, 'LY': -152, 'Ly': -76, 'P ': -37, 'P,': -264, 'P.': -264, 'PA': -152,
    'RT': -37, 'RV': -37, 'RW': -37, 'RY': -37, 'T ': -37, 'T,': -227, 'T-': -113, 'T.': -227,
    'T:': -227, 'T;': -227, 'TA': -152, 'TO': -37, 'Ta': -227, 'Tc': -227, 'Te': -227, 'Ti': -76,
    'To': -227, 'Tr': -76, 'Ts': -227, 'Tu': -76, 'Tw': -113, 'Ty': -113, 'V,': -188, 'V-': -113,
    'V.': -188, 'V:': -76, 'V;': -76, 'VA': -152, 'Va': -152, 'Ve': -113, 'Vi': -37, 'Vo': -113,
    'Vr': -76, 'Vu': -76, 'Vy': -76, 'W,': -113, 'W-': -37, 'W.': -113, 'W:': -37, 'W;': -37,
    'WA': -76, 'Wa': -76, 'We': -37, 'Wo': -37, 'Wr': -37, 'Wu': -37, 'Wy': -18, 'Y ': -37,
    'Y,': -264, 'Y-': -188, 'Y.': -264, 'Y:': -113, 'Y;': -133, 'YA': -152, 'Ya': -152, 'Ye': -188,
    'Yi': -76, 'Yo': -188, 'Yp': -152, 'Yq': -188, 'Yu': -113, 'Yv': -113, 'ff': -37, 'r,': -113,
    'r.': -113, 'v,': -152, 'v.': -152, 'w,': -113, 'w.': -113, 'y,': -152, 'y.': -152,
}

BOLD_ADVANCE: tuple[int, ...] = (  # chr(32) .. chr(126)
    569, 682, 971, 1139, 1139, 1821, 1479, 487, 682, 682, 797, 1196, 569, 682, 569, 569,
    1139, 1139, 1139, 1139, 1139, 1139, 1139, 1139, 1139, 1139, 682, 682, 1196, 1196, 1196, 1251,
    1997, 1479, 1479, 1479, 1479, 1366, 1251, 1593, 1479, 569, 1139, 1479, 1251, 1706, 1479, 1593,
    1366, 1593, 1479, 1366, 1251, 1479, 1366, 1933, 1366, 1366, 1251, 682, 569, 682, 1196, 1139,
    682, 1139, 1251, 1139, 1251, 1139, 682, 1251, 1251, 569, 569, 1139, 569, 1821, 1251, 1251,
    1251, 1251, 797, 1139, 682, 1251, 1139, 1593, 1139, 1139, 1024, 797, 573, 797, 1196,
)
BOLD_KERN: dict[str, int] = {
    ' A': -76, ' Y': -37, 'A ': -76, 'AT': -152, 'AV': -152, 'AW': -113, 'AY': -188, 'Av': -76,
    'Aw': -37, 'Ay': -76, 'F,': -227, 'F.': -227, 'FA': -113, 'L ': -37, 'LT': -152, 'LV': -152,
    'LW': -113, 'LY': -188, 'Ly': -76, 'P ': -37, 'P,': -264, 'P.': -264, 'PA': -152, 'RV': -37,
    'RW': -37, 'RY': -76, 'T,': -227, 'T-': -113, 'T.': -227, 'T:': -227, 'T;': -227, 'TA': -152,
    'TO': -37, 'Ta': -152, 'Tc': -152, 'Te': -152, 'Ti': -37, 'To': -152, 'Tr': -113, 'Ts': -152,
    'Tu': -152, 'Tw': -152, 'Ty': -152, 'V,': -188, 'V-': -113, 'V.': -188, 'V:': -113, 'V;': -113,
    'VA': -152, 'Va': -113, 'Ve': -113, 'Vi': -37, 'Vo': -152, 'Vr': -113, 'Vu': -76, 'Vy': -76,
    'W,': -113, 'W-': -41, 'W.': -113, 'W:': -37, 'W;': -37, 'WA': -113, 'Wa': -76, 'We': -37,
    'Wi': -18, 'Wo': -37, 'Wr': -37, 'Wu': -37, 'Wy': -37, 'Y ': -37, 'Y,': -227, 'Y-': -113,
    'Y.': -227, 'Y:': -152, 'Y;': -152, 'YA': -188, 'Ya': -113, 'Ye': -113, 'Yi': -76, 'Yo': -152,
    'Yp': -113, 'Yq': -152, 'Yu': -113, 'Yv': -113, 'r,': -113, 'r.': -113, 'v,': -152, 'v.': -152,
    'w,': -76, 'w.': -76, 'y,': -152, 'y.': -152,
}



@dataclass(frozen=True)
class Font:
    """A font size and weight, with the metrics the layout needs (all in CSS pixels)."""

    size: float
    bold: bool = False

    @property
    def ascent(self) -> int:
        return round(ASCENDER * self.size / UNITS_PER_EM)

    @property
    def descent(self) -> int:
        return round(DESCENDER * self.size / UNITS_PER_EM)

    @property
    def line_height(self) -> int:
        """``line-height: normal``."""
        return self.ascent + self.descent + round(LINE_GAP * self.size / UNITS_PER_EM)

    def advances(self, text: str, following: str = "") -> list[float]:
        """Per-character advance in px, kerning with the next character (``following`` after the last)."""
        adv = BOLD_ADVANCE if self.bold else REGULAR_ADVANCE
        kern = BOLD_KERN if self.bold else REGULAR_KERN
        scale = self.size * 65536 / UNITS_PER_EM  # HarfBuzz positions are 16.16 fixed point
        padded = text + following[:1]
        out = []
        for i, ch in enumerate(text):
            code = ord(ch)
            units = adv[code - 32] if 32 <= code < 127 else adv[ord("x") - 32]
            fixed = math.floor(units * scale + 0.5)
            pair = kern.get(padded[i : i + 2], 0)
            if pair:
                fixed += math.floor(pair * scale + 0.5)
            out.append(fixed / 65536)
        return out

    def width(self, text: str) -> float:
        """Width of ``text`` shaped as one run (kerning inside it), in px."""
        return sum(self.advances(text))


def snap(px: float) -> float:
    """A length in Chromium's LayoutUnit (1/64 px), rounded to nearest."""
    return round(px * 64) / 64


def ceil64(px: float) -> float:
    """A text width as Chromium's layout takes it: rounded up to 1/64 px (float noise absorbed)."""
    return -(-round(px * 64 * 1024) // 1024) / 64
