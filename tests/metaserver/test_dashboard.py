"""The dashboard in a real headless browser (Debian's chromium + chromedriver, via selenium)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest

webdriver = pytest.importorskip("selenium.webdriver")

CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not CHROMEDRIVER.exists():
    pytest.skip(
        "needs /usr/bin/chromedriver (apt-get install chromium chromium-driver; "
        "scripts/test-deps.sh does it)",
        allow_module_level=True,
    )

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SHOT_DIR = Path(os.environ.get("EMBERFS_SCREENSHOTS", "/tmp"))


@pytest.fixture
def browser():
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,1000")
    for candidate in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if Path(candidate).exists():
            options.binary_location = candidate
            break
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


# The page re-renders every poll, so read it in one script call (an atomic snapshot)
# instead of holding element references that go stale.
SNAPSHOT = """
const pill = (p) => ({target: Number(p.dataset.target), state: p.dataset.state,
                      colour: getComputedStyle(p).backgroundColor});
return {
  health: document.getElementById('health').textContent,
  nodes: document.getElementById('nodes').textContent,
  errorHidden: document.getElementById('error').hidden,
  chains: document.querySelectorAll('#chains tbody tr').length,
  pills: Array.from(document.querySelectorAll('#chains tbody tr span.pill')).map(pill),
  targets: Object.fromEntries(Array.from(document.querySelectorAll('#targets tbody tr'))
                              .map(r => [r.dataset.target, r.dataset.state])),
  scrubbed: Array.from(document.querySelectorAll('#targets td.scrub'))
                 .map(td => Number(td.dataset.lastScrub)),
};
"""


TOKEN = os.environ["EMBERFS_ADMIN_TOKEN"]  # the suite's admin token (tests/conftest.py)


def snapshot(driver) -> dict:
    return driver.execute_script(SNAPSHOT)


def target_states(driver) -> dict[int, str]:
    return {int(k): v for k, v in snapshot(driver)["targets"].items()}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dashboard_shows_chains_and_a_killed_server(private_cluster, browser, tmp_path):
    c = private_cluster(extra_meta_args=["--admin-token", TOKEN])
    browser.get(c.admin_url + "/")
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    page = wait.until(lambda d: (s := snapshot(d))["chains"] == 2 and len(s["targets"]) == 6 and s)
    assert page["health"] == "healthy"
    assert page["nodes"] == "3"
    assert len(page["pills"]) == 6 and {p["state"] for p in page["pills"]} == {"serving"}
    assert "31, 157, 85" in page["pills"][0]["colour"]  # serving is green
    browser.save_screenshot(str(SHOT_DIR / "emberfs-dashboard-healthy.png"))

    # a scrub pass started by hand shows up as every target's last full pass
    start = urllib.request.Request(
        c.admin_url + "/api/v1/scrub/start",
        method="POST",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    with urllib.request.urlopen(start, timeout=10) as resp:
        assert json.load(resp)["paused"] is False
    page = wait.until(
        lambda d: (s := snapshot(d))["scrubbed"] and len(s["scrubbed"]) == 6 and all(s["scrubbed"])
    )

    routing = c.routing()
    victim = c.storage_address(0)
    killed = {t.target_id for t in routing.targets if t.data_address == victim}
    c.kill_storage(0)
    wait = WebDriverWait(browser, 30, poll_frequency=0.25)
    page = wait.until(
        lambda d: (
            (s := snapshot(d))["health"] == "degraded"
            and all(s["targets"].get(str(t)) == "offline" for t in killed)
            and s
        )
    )
    offline = [p for p in page["pills"] if p["state"] == "offline"]
    assert {p["target"] for p in offline} == killed
    assert "210, 60, 60" in offline[0]["colour"]  # red
    assert page["errorHidden"]
    browser.save_screenshot(str(SHOT_DIR / "emberfs-dashboard-degraded.png"))
