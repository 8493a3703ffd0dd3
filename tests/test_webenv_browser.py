"""The mirror against real MiniWoB++ in headless Chromium (slow; skipped without a browser).

For every task that exists in MiniWoB++, one browser plays seeds 0-19 with the oracle and five seeds of a
seeded random policy next to the mirror, comparing every observation: instruction, rendered text, and each
element's ref, parent, tag, text, value, id, classes and flags exactly; boxes to within half a pixel
(they agree to the 1/64 px here, but font rasterisation may move between Chromium releases).
"""

from __future__ import annotations

import random

import pytest

from graftkit.webenv import TASKS, make_env, oracle, render_som, render_text
from graftkit.webenv.policies import random_action
from graftkit.webenv.real import browser_available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not browser_available(), reason="needs chromium, chromium-driver and the miniwob package"),
]

BROWSER_TASKS = sorted(t for t, cls in TASKS.items() if cls.in_miniwob)
BOX_TOLERANCE = 0.5  # px
#: Seeds per task: twenty oracle episodes and five random ones (fifty and ten took four minutes of the suite on 2 cores).
ORACLE_SEEDS, RANDOM_SEEDS = range(20), range(1000, 1005)


def assert_same(mirror_obs, real_obs, where: str) -> None:
    assert mirror_obs.utterance == real_obs.utterance, where
    assert render_text(mirror_obs) == render_text(real_obs), where
    ident = lambda e: (e.ref, e.parent, e.tag, e.text, e.value, e.id, e.classes, e.focused, e.tampered,  # noqa: E731
                       e.is_leaf)
    assert [ident(e) for e in mirror_obs.elements] == [ident(e) for e in real_obs.elements], where
    for m, r in zip(mirror_obs.elements, real_obs.elements):
        gap = max(abs(m.left - r.left), abs(m.top - r.top), abs(m.width - r.width), abs(m.height - r.height))
        assert gap <= BOX_TOLERANCE, f"{where}: ref {m.ref} box {m.left, m.top, m.width, m.height} vs " \
                                     f"{r.left, r.top, r.width, r.height}"


def play_both(mirror, real, seed: int, policy=None) -> None:
    """Reset both to ``seed``, then play the oracle's actions (planning again from the mirror's
    observation when a plan ends before the episode), or ``policy(obs)``, turn by turn."""
    m, r = mirror.reset(seed), real.reset(seed)
    assert_same(m, r, f"{mirror.task} seed {seed} reset")
    plan: list[str] = []
    for turn in range(TASKS[mirror.task].max_steps):
        if policy is None:
            plan = plan or oracle(m)
            action = plan.pop(0)
        else:
            action = policy(m)
        ms, rs = mirror.step(action), real.step(action)
        where = f"{mirror.task} seed {seed} after {action}"
        assert (ms.reward, ms.done) == (rs.reward, rs.done), where
        assert_same(ms.observation, rs.observation, where)
        m = ms.observation
        if ms.done:
            break


@pytest.mark.parametrize("task", BROWSER_TASKS)
def test_mirror_matches_the_browser(task):
    mirror = make_env(task)
    with make_env(task, backend="miniwob") as real:
        for seed in ORACLE_SEEDS:
            play_both(mirror, real, seed)
            assert mirror.success and real.success, f"{task} seed {seed}: oracle failed"
        rng = random.Random(task)
        for seed in RANDOM_SEEDS:  # the odd corners: random clicks and typing anywhere
            play_both(mirror, real, seed, lambda obs: random_action(obs, rng))


def test_som_over_the_browser_screenshot():
    with make_env("click-checkboxes", backend="miniwob", screenshots=True) as real:
        obs = real.reset(0)
        assert obs.screenshot.shape == (210, 160, 3)
        img, marks = render_som(obs, scale=2)
    assert img.size == (320, 420)
    boxes = [e.ref for e in obs.elements if e.tag == "input_checkbox"]
    submit = [e.ref for e in obs.elements if e.tag == "button"]
    assert [m.ref for m in marks] == boxes + submit
    assert [m.ref for m in marks] == [m.ref for m in render_som(make_env("click-checkboxes").reset(0))[1]]
