"""The real backend: MiniWoB++ in headless Chromium through the ``miniwob`` package and Selenium.

Settings (docs/tasks.md, "Real MiniWoB++"): ``SE_OFFLINE=true`` so Selenium does not reach for the network,
Debian's ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` passed to ``miniwob`` through
``MINIWOB_CHROME_BINARY`` / ``MINIWOB_CHROMEDRIVER`` (it reads both in
``SeleniumInstance.create_driver``), ``core.EPISODE_MAX_TIME`` raised right after the page loads so no
episode times out, and success read from the raw (not time-discounted) reward.

Actions map onto ``miniwob``'s action types: ``click(r)`` → ``CLICK_ELEMENT`` (``core.elementClick``),
``type(r, "t")`` → ``FOCUS_ELEMENT_AND_TYPE_TEXT``. A step performs the action, waits out a task's
pending timers (jQuery UI's 300 ms autocomplete delay) as the mirror settles them, then reads the
metadata and the observation — the body of ``SeleniumInstance.step`` with that wait in between.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from ..core.env import Step
from ..core.errors import GraftkitError
from .actions import Action
from .env import WebEnv
from .observation import Element, Observation, empty_observation

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL_BROWSER = "install with: apt-get install -y chromium chromium-driver"
INSTALL_PACKAGES = "install with: pip install miniwob gymnasium selenium"
EPISODE_MAX_TIME_MS = 1_000_000_000  # ~11.6 days; setTimeout wraps above 2^31 - 1 ms
# Before each episode: take focus off the focused element (closing an open autocomplete menu) and
# empty jQuery UI's screen-reader live regions, whose last message would otherwise stay visible into
# the next episode and take a ref. The mirror does the same (env.MirrorEnv.reset, Task.before_episode).
RESET_SCRIPT = """
if (document.activeElement && document.activeElement !== document.body) document.activeElement.blur();
document.querySelectorAll('.ui-helper-hidden-accessible').forEach(function (el) {
  while (el.firstChild) el.removeChild(el.firstChild);
});
"""


def browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver, from the MINIWOB_* variables or Debian's paths; a clear error if absent."""
    binary = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium") or CHROMIUM
    driver = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver") or CHROMEDRIVER
    missing = [p for p in (binary, driver) if not Path(p).is_file()]
    if missing:
        raise GraftkitError(f"the miniwob backend needs Chromium and chromedriver; not found: {', '.join(missing)}",
                            INSTALL_BROWSER)
    return binary, driver


def browser_available() -> bool:
    try:
        browser_paths()
        import gymnasium  # noqa: F401
        import miniwob  # noqa: F401
        import selenium  # noqa: F401
    except (GraftkitError, ImportError):
        return False
    return True


class MiniWobEnv(WebEnv):
    """One headless Chromium on one MiniWoB++ task page, reused across episodes."""

    backend = "miniwob"

    def __init__(self, task: str, screenshots: bool = False):
        super().__init__(task)
        if not self.spec.in_miniwob:
            raise GraftkitError(f"{task} exists only in the mirror", "use backend py for it")
        binary, driver = browser_paths()
        os.environ.setdefault("SE_OFFLINE", "true")
        os.environ["MINIWOB_CHROME_BINARY"] = binary
        os.environ["MINIWOB_CHROMEDRIVER"] = driver
        try:
            import gymnasium
            import miniwob
            from miniwob.action import ActionTypes
        except ImportError as e:
            raise GraftkitError(f"the miniwob backend needs the miniwob, gymnasium and selenium packages ({e})",
                                INSTALL_PACKAGES) from None
        gymnasium.register_envs(miniwob)
        self.screenshots = screenshots
        self._env = gymnasium.make(f"miniwob/{task}-v1")
        inner = self._env.unwrapped
        self._instance = inner.instance
        self._config = inner.action_space_config
        self._types = {kind: self._config.action_types.index(t) for kind, t in
                       (("click", ActionTypes.CLICK_ELEMENT), ("type", ActionTypes.FOCUS_ELEMENT_AND_TYPE_TEXT))}
        self._driver.execute_script(f"core.EPISODE_MAX_TIME = {EPISODE_MAX_TIME_MS};")

    @property
    def _driver(self):
        return self._instance.driver

    def reset(self, seed: int) -> Observation:
        self._driver.execute_script(RESET_SCRIPT)
        obs, _ = self._env.reset(seed=seed, options={"record_screenshots": self.screenshots})
        self.done, self.raw_reward = False, 0.0
        return self._convert(obs)

    def _act(self, action: Action) -> Step:
        act = {"action_type": self._types[action.kind], "ref": action.ref, "text": action.text}
        self._instance.perform(act, self._config)
        if action.kind == "type" and self.spec.settle_ms:
            self._driver.execute_async_script(
                f"var done = arguments[arguments.length - 1]; setTimeout(done, {self.spec.settle_ms + 10});")
        meta = self._instance.get_metadata()
        if meta["done"]:
            return Step(empty_observation(self.task), float(meta["raw_reward"]), True)
        obs, _ = self._instance.get_observation(use_cached_fields=True)
        return Step(self._convert(obs), 0.0, False)

    def _convert(self, obs: dict) -> Observation:
        elements = tuple(
            Element(ref=int(e["ref"]), parent=int(e["parent"]), tag=str(e["tag"]), text=str(e["text"]),
                    value=str(e["value"]), id=str(e["id"]), classes=str(e["classes"]),
                    left=float(e["left"][0]), top=float(e["top"][0]), width=float(e["width"][0]),
                    height=float(e["height"][0]), focused=bool(e["flags"][0]), tampered=bool(e["flags"][1]),
                    is_leaf=bool(e["flags"][3]))
            for e in obs["dom_elements"]
        )
        shot = np.asarray(obs["screenshot"]) if self.screenshots else None
        return Observation(task=self.task, utterance=str(obs["utterance"]), elements=elements, screenshot=shot)

    def close(self) -> None:
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            env.close()
