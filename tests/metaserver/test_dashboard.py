"""The dashboard in a real headless browser (Debian's chromium + chromedriver, via selenium)."""

from __future__ import annotations

import os
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
from selenium.webdriver.common.by import By  # noqa: E402
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


def target_states(driver) -> dict[int, str]:
    rows = driver.find_elements(By.CSS_SELECTOR, "#targets tbody tr")
    return {int(r.get_attribute("data-target")): r.get_attribute("data-state") for r in rows}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dashboard_shows_chains_and_a_killed_server(private_cluster, browser, tmp_path):
    c = private_cluster()
    browser.get(c.admin_url + "/")
    wait = WebDriverWait(browser, 20, poll_frequency=0.2)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#chains tbody tr")) == 2)
    assert browser.find_element(By.ID, "health").text == "healthy"
    pills = browser.find_elements(By.CSS_SELECTOR, "#chains tbody tr span.pill")
    assert len(pills) == 6 and {p.get_attribute("data-state") for p in pills} == {"serving"}
    wait.until(lambda d: len(target_states(d)) == 6)
    assert browser.find_element(By.ID, "nodes").text == "3"
    colour = pills[0].value_of_css_property("background-color")
    assert "31, 157, 85" in colour  # serving is green
    browser.save_screenshot(str(SHOT_DIR / "emberfs-dashboard-healthy.png"))

    routing = c.routing()
    victim = c.storage_address(0)
    killed = {t.target_id for t in routing.targets if t.data_address == victim}
    c.kill_storage(0)
    wait = WebDriverWait(browser, 30, poll_frequency=0.25)
    wait.until(lambda d: all(target_states(d).get(t) == "offline" for t in killed))
    wait.until(lambda d: d.find_element(By.ID, "health").text == "degraded")
    offline = browser.find_elements(By.CSS_SELECTOR, '#chains span.pill[data-state="offline"]')
    assert {int(p.get_attribute("data-target")) for p in offline} == killed
    assert "210, 60, 60" in offline[0].value_of_css_property("background-color")  # red
    assert browser.find_element(By.ID, "error").get_attribute("hidden") is not None
    browser.save_screenshot(str(SHOT_DIR / "emberfs-dashboard-degraded.png"))
