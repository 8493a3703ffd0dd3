"""Render a report in headless Chromium (Selenium, Debian's chromium and chromedriver; docs/tasks.md).

Used by ``graftkit report --screenshot`` and by the browser test. ``SE_OFFLINE=true`` keeps Selenium from
reaching for the network; the page itself needs none (plotly.js is inlined).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from ..core.errors import GraftkitError

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser_available() -> bool:
    """Selenium importable and a Chromium with its driver installed."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return False
    return bool((shutil.which("chromium") or Path(CHROMIUM).exists())
                and (shutil.which("chromedriver") or Path(CHROMEDRIVER).exists()))


def chromium(width: int = 1400, height: int = 1000):
    """A headless Chromium WebDriver that records the browser console (``driver.get_log("browser")``)."""
    os.environ.setdefault("SE_OFFLINE", "true")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise GraftkitError("selenium is not installed", "pip install 'graftkit[browser]'") from None
    binary = os.environ.get("MINIWOB_CHROME_BINARY") or shutil.which("chromium") or CHROMIUM
    driver_path = os.environ.get("MINIWOB_CHROMEDRIVER") or shutil.which("chromedriver") or CHROMEDRIVER
    if not Path(binary).exists() or not Path(driver_path).exists():
        raise GraftkitError(f"Chromium ({binary}) or chromedriver ({driver_path}) not found",
                            "apt-get install chromium chromium-driver (or `make browser`)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=opts)


def wait_rendered(driver, timeout: float = 60.0) -> int:
    """Wait until the report's script has drawn every figure; returns how many it drew."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        n = driver.execute_script("return document.body && document.body.getAttribute('data-rendered')")
        if n is not None:
            return int(n)
        time.sleep(0.1)
    raise GraftkitError(f"the report did not finish drawing within {timeout:.0f} s",
                        "open it in a browser and check the JavaScript console")


def screenshot(html_path: str | os.PathLike, png_path: str | os.PathLike, width: int = 1400,
               max_height: int = 16000) -> Path:
    """Save a PNG of the whole report (up to ``max_height`` pixels tall)."""
    html_path, png_path = Path(html_path).resolve(), Path(png_path)
    driver = chromium(width, 1000)
    try:
        driver.get(html_path.as_uri())
        wait_rendered(driver)
        height = int(driver.execute_script("return document.documentElement.scrollHeight"))
        driver.set_window_size(width, min(max(height, 600), max_height))
        time.sleep(0.5)  # responsive figures redraw at the new size
        png_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = png_path.with_name(f".{png_path.name}.tmp-{os.getpid()}.png")
        if not driver.save_screenshot(str(tmp)):
            raise GraftkitError(f"Chromium could not save a screenshot to {tmp}", "check the folder is writable")
        os.replace(tmp, png_path)
    finally:
        driver.quit()
    return png_path
