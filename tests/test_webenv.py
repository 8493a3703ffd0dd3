"""The MiniWoB++ mirror (fast, no browser): seeded generator, recorded Chromium episodes, semantics,
action grammar, renderers, oracles and progress. ``test_webenv_browser.py`` compares with Chromium live."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from graftkit import webenv
from graftkit.core.errors import GraftkitError
from graftkit.webenv import (
    TASKS,
    Action,
    ParseError,
    make_env,
    oracle,
    parse_action,
    progress,
    render_som,
    render_text,
    som_marks,
)
from graftkit.webenv import words
from graftkit.webenv.policies import random_action
from graftkit.webenv.render import PALETTE, is_interactive
from graftkit.webenv.seedrandom import SeedRandom

ROOT = Path(__file__).resolve().parents[1]

# Math.seedrandom(seed) then Math.random() five times, run with node on the seedrandom.js that
# miniwob 1.1.0 ships in html/core/core.js.
JS_RANDOM = {
    0: [0.038085370776470735, 0.08624634995353292, 0.5921039987135952, 0.5283513935579917, 0.9201975820617915],
    1: [0.1776348083296759, 0.21606903041839373, 0.5251053930849383, 0.6111927269176093, 0.17465900859858835],
    49: [0.05851670504122768, 0.2494752714368272, 0.7057119200383077, 0.5118798103362309, 0.38454819427950004],
    123456: [0.5941327653045878, 0.9703167831110201, 0.047932206130030554, 0.3269411830458695, 0.7164542184074899],
    -3: [0.42061520971461464, 0.9866660397502174, 0.7233300478171036, 0.1328720329929451, 0.0026399075353247038],
    "abc": [0.7319428070286753, 0.6472995620587413, 0.7150830336207971, 0.6316332598487158, 0.39283784326843896],
}

# sha256 (first 16 hex digits) of the first observations of seeds 0-49, every field of every element
# including its box, recorded from Chromium 1xx headless through miniwob 1.1.0 (see episode_digest).
CHROMIUM_DIGESTS = {
    "click-button": "29932053780020f0",
    "click-link": "a7047e2f293605ee",
    "enter-text": "690427329e127995",
    "focus-text": "9ade2706d68623f2",
    "focus-text-2": "63cb644be2f8db60",
    "click-checkboxes": "14cfbf0e7a016662",
    "click-tab": "82d8eab907cf37cd",
    "use-autocomplete": "b064db5a5162d4be",
    "click-checkboxes-large": "a5a3717313e0fee7",
    "login-user": "99ebbc565b9cd487",
    "enter-password": "1e4cfcb4384ea02a",
    "enter-text-2": "80d5df27b2b52e1e",
    "click-tab-2": "b623b71f3d74d3b4",
}


# The same, for a seeded random policy (webenv.policies.random_action, random.Random(task)) playing
# seeds 1000-1009 for up to 6 actions each: every action, reward and observation along the way.
CHROMIUM_RANDOM_RUN_DIGESTS = {
    "click-button": "0963df0a7edab2d4",
    "click-link": "9d1dba6c3e8345c4",
    "enter-text": "284819046ca47223",
    "focus-text": "ca550fa7c7256739",
    "focus-text-2": "98a21a68d5cd81f9",
    "click-checkboxes": "dffd377733392cde",
    "click-tab": "f4771e93ce100ffc",
    "use-autocomplete": "911145f5a374c29a",
    "click-checkboxes-large": "6238de634af25092",
    "login-user": "00516e9a7879e4c6",
    "enter-password": "3b37f7573862e887",
    "enter-text-2": "5396ab14843e41cc",
    "click-tab-2": "9dcc5a6d560b492d",
}


def observation_key(obs) -> list:
    return [obs.utterance] + [[e.ref, e.parent, e.tag, e.text, e.value, e.id, e.classes, e.left, e.top, e.width,
                               e.height, e.focused, e.tampered, e.is_leaf] for e in obs.elements]


def episode_digest(task: str, seeds=range(50)) -> str:
    env = make_env(task)
    keys = [observation_key(env.reset(s)) for s in seeds]
    return hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]


def random_run_digest(task: str) -> str:
    env, rng, trace = make_env(task), random.Random(task), []
    for seed in range(1000, 1010):
        obs = env.reset(seed)
        trace.append(observation_key(obs))
        for _ in range(6):
            action = random_action(obs, rng)
            obs, reward, done = env.step(action)
            trace.append([action, reward, done, observation_key(obs)])
            if done:
                break
    return hashlib.sha256(json.dumps(trace).encode()).hexdigest()[:16]


def play(task: str, seed: int, actions=None):
    env = make_env(task)
    first = env.reset(seed)
    steps = [env.step(a) for a in (oracle(first) if actions is None else actions)]
    return env, first, steps


# --- the seeded generator and the word lists -----------------------------------------------------------

@pytest.mark.parametrize("seed", list(JS_RANDOM))
def test_seedrandom_matches_javascript(seed):
    rng = SeedRandom(seed)
    assert [rng.random() for _ in range(5)] == JS_RANDOM[seed]


def test_seedrandom_rejects_floats():
    with pytest.raises(TypeError):
        SeedRandom(1.5)


def test_bundled_words_equal_installed_file():
    path = words.installed_ui_utils()
    if path is None:
        pytest.skip("miniwob is not installed")
    from graftkit.webenv import _miniwob_words

    parsed = words.parse_ui_utils(path.read_text(encoding="utf-8"))
    for name in words.USED:
        assert getattr(_miniwob_words, name) == parsed[name], name


@pytest.mark.parametrize("task", ["click-link", "enter-text", "use-autocomplete", "click-checkboxes",
                                  "enter-text-long"])
def test_mirror_runs_without_the_miniwob_package(monkeypatch, task):
    installed = episode_digest(task, range(10))
    monkeypatch.setattr(words, "installed_ui_utils", lambda: None)
    words.ui_utils.cache_clear()
    try:
        assert words.source() == "bundled"
        assert episode_digest(task, range(10)) == installed
    finally:
        words.ui_utils.cache_clear()


# --- the mirror reproduces recorded browser episodes ------------------------------------------------------

@pytest.mark.parametrize("task", sorted(CHROMIUM_DIGESTS))
def test_mirror_reproduces_recorded_chromium_episodes(task):
    assert episode_digest(task) == CHROMIUM_DIGESTS[task]


@pytest.mark.parametrize("task", sorted(CHROMIUM_RANDOM_RUN_DIGESTS))
def test_mirror_reproduces_recorded_chromium_random_play(task):
    """Random clicks and typing anywhere (containers, text fragments, unknown refs, menus) behave as
    they did in Chromium: focus, toggles, menus, live-region messages, rewards."""
    assert random_run_digest(task) == CHROMIUM_RANDOM_RUN_DIGESTS[task]


def test_every_browser_task_has_a_recording():
    browser_tasks = {t for t, cls in TASKS.items() if cls.in_miniwob}
    assert browser_tasks == set(CHROMIUM_DIGESTS) == set(CHROMIUM_RANDOM_RUN_DIGESTS)


def _rendered_run() -> str:
    h = hashlib.sha256()
    for task in TASKS:
        env = make_env(task)
        for seed in range(10):
            obs = env.reset(seed)
            h.update(render_text(obs).encode())
            for action in oracle(obs):
                step = env.step(action)
                h.update(f"{render_text(step.observation)}|{step.reward}|{step.done}".encode())
    return h.hexdigest()


@pytest.mark.parametrize("task", ["enter-text", "use-autocomplete", "click-checkboxes"])
def test_an_episode_renders_the_same_on_a_fresh_or_a_used_env(task):
    used = make_env(task)
    for seed in range(5):
        first = used.reset(seed)
        for action in oracle(first)[:-1] + ['type(5, "Ab")', "click(6)"]:
            if not used.step(action).done:
                continue
            break
    for seed in range(5, 10):
        fresh_obs, used_obs = make_env(task).reset(seed), used.reset(seed)
        assert render_text(fresh_obs) == render_text(used_obs)
        fresh_steps = [render_text(s.observation) for s in play(task, seed)[2]]
        used_steps = [render_text(used.step(a).observation) for a in oracle(used_obs)]
        assert fresh_steps == used_steps


def test_mirror_is_deterministic_across_processes():
    code = "import sys; sys.path.insert(0, sys.argv[1]); import test_webenv as t; print(t._rendered_run())"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True,
                         text=True, env=env, check=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == _rendered_run()


# --- MiniWoB++ semantics -----------------------------------------------------------------------------------

@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("who", ["oracle", "demonstrator"])
def test_oracle_and_demonstrator_solve_seeds_0_to_49(task, who):
    env = make_env(task)
    for seed in range(50):
        obs = env.reset(seed)
        turns = list(webenv.demonstrate(env, obs, oracle=who == "oracle"))
        assert 0 < len(turns) <= TASKS[task].max_steps
        step = turns[-1][2]
        assert step.done and step.reward == 1.0 and env.success, (task, seed)


def test_click_tab_2_hides_the_link_and_only_the_demonstrator_knows_where():
    """The observation lists only the open panel; where the link is elsewhere, the oracle (reading the
    observation) opens the next tab, the demonstrator (reading the page) the tab that holds it, and a
    click on the open tab changes nothing."""
    env, spec = make_env("click-tab-2"), TASKS["click-tab-2"]
    hidden = direct = 0
    for seed in range(60):
        obs = env.reset(seed)
        if spec._link(obs) is not None:
            continue
        hidden += 1
        tabs = {e.text: e.ref for e in obs.elements if e.tag == "a"}
        assert oracle(obs) == [f"click({tabs['Tab #2']})"]
        (first,) = env.demonstration(obs)
        after = env.step(first).observation
        assert spec._link(after) is not None  # the demonstrator opened the right tab
        direct += first != oracle(obs)[0]
        again = env.step(first).observation  # the open tab: a no-op
        assert render_text(again) == render_text(after) and not env.done
    assert hidden >= 20 and 0 < direct < hidden


def test_ambiguous_episodes_are_exactly_those_the_page_cannot_decide():
    """click-checkboxes seed 10747552 lists 'Db' once and shows two boxes labelled 'Db' (one wanted): the
    oracle cannot know which; every episode not declared ambiguous is solved."""
    env, spec = make_env("click-checkboxes"), TASKS["click-checkboxes"]
    obs = env.reset(10747552)
    labels = [t for _, t in spec._checkboxes(obs)]
    assert labels.count("Db") == 2 and spec._targets(obs).count("Db") == 1 and spec.ambiguous(obs)
    seen = 0
    for seed in range(10747000, 10747600):
        obs = env.reset(seed)
        if spec.ambiguous(obs):
            seen += 1
            continue
        for action in oracle(obs):
            env.step(action)
        assert env.success, seed
    assert seen >= 1
    assert not any(TASKS[t].ambiguous(make_env(t).reset(0)) for t in TASKS if t != "click-checkboxes")


@pytest.mark.parametrize("task, wrong", [
    ("click-button", lambda obs: next(e for e in obs.elements if e.tag == "button" and f'"{e.text}"' not in obs.utterance)),
    ("click-link", lambda obs: next(e for e in obs.elements if e.tag == "span" and f'"{e.text}"' not in obs.utterance)),
    ("click-tab", lambda obs: next(e for e in obs.elements if e.tag == "a" and e.text not in obs.utterance)),
])
def test_wrong_button_link_or_tab_ends_with_minus_one(task, wrong):
    env = make_env(task)
    for seed in range(20):
        obs = env.reset(seed)
        try:
            target = wrong(obs)
        except StopIteration:
            continue
        step = env.step(f"click({target.ref})")
        assert step.done and step.reward == -1.0 and not env.success
        assert step.observation.empty
        return
    pytest.fail("no seed with a wrong choice")


def test_unknown_ref_does_nothing():
    env = make_env("click-checkboxes")
    first = env.reset(3)
    for action in ("click(999)", "click(-1)", "click(0)"):
        step = env.step(action)
        assert not step.done and step.reward == 0.0
        same = [e for e in step.observation.elements if e.ref > 0]
        assert same == [e for e in first.elements if e.ref > 0]


def test_typing_appends_and_submit_checks_the_field():
    env = make_env("enter-text")
    obs = env.reset(0)  # Enter "Agustina"
    field = next(e for e in obs.elements if e.tag == "input_text")
    env.step(f'type({field.ref}, "Agus")')
    obs = env.step(f'type({field.ref}, "tina")').observation
    assert obs.by_ref(field.ref).value == "Agustina" and obs.by_ref(field.ref).focused
    submit = next(e for e in obs.elements if e.tag == "button")
    assert env.step(f"click({submit.ref})").reward == 1.0


def test_unknown_ref_types_into_the_focused_field():
    env = make_env("enter-text")
    obs = env.reset(0)
    field = next(e for e in obs.elements if e.tag == "input_text")
    env.step(f"click({field.ref})")
    assert env.step('type(999, "ab")').observation.by_ref(field.ref).value == "ab"


def test_checkbox_and_its_label_toggle():
    env = make_env("click-checkboxes")
    obs = env.reset(0)
    box = next(e for e in obs.elements if e.tag == "input_checkbox")
    lab = obs.by_ref(box.parent)
    assert lab.tag == "label" and not box.checked
    obs = env.step(f"click({lab.ref})").observation
    assert obs.by_ref(box.ref).checked and obs.by_ref(box.ref).focused and obs.by_ref(lab.ref).tampered
    obs = env.step(f"click({box.ref})").observation
    assert not obs.by_ref(box.ref).checked
    obs = env.step(f'type({box.ref}, " ")').observation  # click toggles, then Space toggles back
    assert not obs.by_ref(box.ref).checked


def test_text_fragment_refs_are_fresh_at_every_observation():
    env = make_env("click-checkboxes")
    first = env.reset(0)
    again = env.step("click(999)").observation
    t0 = [e.ref for e in first.elements if e.tag == "t"]
    t1 = [e.ref for e in again.elements if e.tag == "t"]
    assert t0 == [-1, -2] and t1 == [-3, -4]


def test_autocomplete_menu_appears_and_an_item_can_be_chosen():
    env = make_env("use-autocomplete")
    obs = env.reset(0)  # starts with "An", ends with "ica"
    field = next(e for e in obs.elements if e.id == "tags")
    obs = env.step(f'type({field.ref}, "An")').observation
    items = [e for e in obs.elements if "ui-menu-item-wrapper" in e.classes]
    assert [e.text for e in items] == ["Andorra", "Angola", "Anguilla", "Antarctica", "Antigua and Barbuda"]
    pick = next(e for e in items if e.text == "Antarctica")
    obs = env.step(f"click({pick.ref})").observation
    assert obs.by_ref(field.ref).value == "Antarctica"
    assert not any("ui-menu-item-wrapper" in e.classes for e in obs.elements)
    submit = next(e for e in obs.elements if e.tag == "button")
    assert env.step(f"click({submit.ref})").reward == 1.0


def test_focus_text_succeeds_on_focus():
    env, first, steps = play("focus-text", 0)
    assert steps[-1].reward == 1.0


def test_checkbox_reward_is_the_raw_fraction():
    env = make_env("click-checkboxes")
    obs = env.reset(2)  # Select fzzqo, NYYyS82 (two of three boxes)
    submit = next(e for e in obs.elements if e.tag == "button")
    step = env.step(f"click({submit.ref})")
    assert step.done and step.reward == pytest.approx(-1 / 3) and not env.success


def test_env_errors_are_clear():
    with pytest.raises(GraftkitError, match="unknown web task"):
        make_env("no-such-task")
    env, _, _ = play("click-button", 0)
    with pytest.raises(GraftkitError, match="reset"):
        env.step("click(1)")
    with pytest.raises(ParseError):
        make_env("click-button").step("click 4")


def test_missing_browser_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIWOB_CHROME_BINARY", str(tmp_path / "no-chromium"))
    monkeypatch.setenv("MINIWOB_CHROMEDRIVER", str(tmp_path / "no-chromedriver"))
    with pytest.raises(GraftkitError, match="apt-get install -y chromium chromium-driver"):
        make_env("click-button", backend="miniwob")


def test_mirror_only_tasks_refuse_the_browser():
    with pytest.raises(GraftkitError, match="only in the mirror"):
        make_env("fill-form", backend="miniwob")


# --- progress ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("task", sorted(TASKS))
def test_progress_rises_along_the_oracle_and_ends_at_one(task):
    for seed in range(10):
        env = make_env(task)
        first = obs = env.reset(seed)
        scores = [progress(first, obs, 0.0, False)]
        for _, _, (obs, reward, done) in webenv.demonstrate(env, first):
            scores.append(progress(first, obs, reward, done))
        assert all(0.0 <= s <= 1.0 for s in scores)
        assert scores == sorted(scores) and scores[-1] == 1.0 and max(scores[:-1]) < 1.0


def test_progress_gives_partial_credit_and_zero_on_failure():
    env = make_env("click-checkboxes")
    first = env.reset(2)  # two of three boxes to select
    boxes = [e for e in first.elements if e.tag == "input_checkbox"]
    obs = env.step(f"click({boxes[0].ref})").observation  # fzzqo: a wanted box
    assert progress(first, obs, 0.0, False) == pytest.approx(1 / 3)
    obs = env.step(f"click({boxes[2].ref})").observation  # an unwanted box cancels it
    assert progress(first, obs, 0.0, False) == 0.0
    submit = next(e for e in obs.elements if e.tag == "button")
    step = env.step(f"click({submit.ref})")
    assert progress(first, step.observation, step.reward, step.done) == 0.0


# --- the action grammar ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("click(8)", Action("click", 8)),
    ("  click( 12 )\n", Action("click", 12)),
    ("click(-3)", Action("click", -3)),
    ('type(5, "Agustina")', Action("type", 5, "Agustina")),
    ('type(5,"a b")', Action("type", 5, "a b")),
    ('type(5, "say \\"hi\\" \\\\o/")', Action("type", 5, 'say "hi" \\o/')),
    ('type(5, " ")', Action("type", 5, " ")),
])
def test_parser_accepts(text, want):
    assert parse_action(text) == want
    assert parse_action(str(want)) == want


@pytest.mark.parametrize("text", [
    "", "click", "click()", "click(a)", "click(1.5)", "click(1, 2)", "Click(1)", "click(1);",
    "click(1) click(2)", "type(5)", "type(5, Agustina)", "type(5, 'Agustina')", 'type(5, "")', 'type(5, "abc',
    'type("5", "a")', 'type(5, "a\\n")', 'type(5, "é")', 'type(5, "' + "x" * 65 + '")', 'type(5, "a", "b")',
    "press(5, \"Enter\")", "noop",
])
def test_parser_rejects(text):
    with pytest.raises(ParseError):
        parse_action(text)


def test_parse_error_is_a_graftkit_error():
    assert issubclass(ParseError, GraftkitError)


# --- renderers ---------------------------------------------------------------------------------------------

def test_render_text_format():
    env = make_env("click-checkboxes")
    obs = env.reset(0)
    assert render_text(obs) == (
        "Instruction: Select HF2 and click Submit.\n"
        '[6] input_checkbox "AU" unchecked\n'
        '[8] input_checkbox "HF2" unchecked\n'
        '[9] button "Submit"'
    )
    obs = env.step("click(8)").observation
    assert '[8] input_checkbox "HF2" checked focused' in render_text(obs)


def test_render_text_joins_wrapped_text_and_shows_links():
    env = make_env("click-link")
    text = render_text(env.reset(0))
    assert text.splitlines()[:4] == ['Instruction: Click on the link "Eget".', 'text "Donec"', '[4] span "ridiculus"',
                                     '[5] span "eget"']
    assert 'text "rhoncus, pellentesque"' in text  # one text node split over two lines, joined


def _expected_marks(obs) -> set[int]:
    return {e.ref for e in obs.elements if e.tag.startswith("input_") or e.tag in ("button", "a")
            or "alink" in e.classes.split() or "ui-menu-item-wrapper" in e.classes}


@pytest.mark.parametrize("task, actions", [
    ("click-checkboxes", []), ("click-tab", []), ("click-link", []), ("enter-text", []),
    ("use-autocomplete", ['type(5, "An")']), ("login-user", []),
])
def test_som_draws_one_box_per_interactive_element(task, actions):
    env = make_env(task)
    obs = env.reset(0)
    for a in actions:
        obs = env.step(a).observation
    img, marks = render_som(obs, scale=2)
    refs = [m.ref for m in marks]
    assert len(refs) == len(set(refs))
    want = {r for r in _expected_marks(obs)  # list items lose to the menu-item divs inside them
            if (e := obs.by_ref(r)).area >= 20 and e.top < 210 and e.left < 160}
    assert set(refs) == want
    assert img.size == (320, 420)
    for i, mark in enumerate(marks):  # the box's top-left pixel carries the mark's colour
        x, y = int(mark.box[0] * 2), int(mark.box[1] * 2)
        assert img.getpixel((x, y)) == PALETTE[i % len(PALETTE)]


def test_som_innermost_wins():
    env = make_env("click-tab")
    obs = env.reset(0)
    marks = {m.ref for m in som_marks(obs)}
    tabs = [e for e in obs.elements if e.tag == "li"]
    anchors = [e for e in obs.elements if e.tag == "a"]
    assert all(is_interactive(li) for li in tabs)
    assert marks == {a.ref for a in anchors}


def test_som_mirror_image_is_deterministic():
    obs = make_env("click-button").reset(4)
    a, _ = render_som(obs)
    b, _ = render_som(make_env("click-button").reset(4))
    assert a.tobytes() == b.tobytes()


def test_webenv_imports_no_other_graftkit_package():
    import ast

    for path in (ROOT / "webenv").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert (node.module or "").split(".")[0] == "core", f"{path.name} imports ..{node.module}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("graftkit"):
                pytest.fail(f"{path.name} imports {node.module}")
