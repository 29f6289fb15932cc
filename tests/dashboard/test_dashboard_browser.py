"""The dashboard in a real browser: headless Chromium (Debian's, driven by selenium through Debian's
chromedriver) loads `groupwise dashboard` (a real subprocess, over HTTP) on a run folder that this test
writes into, and reads what the page rendered: the runs list, the reward curve with its band, the
validation with its interval, an alert marker, a group view, the token view, two steps compared, and a
new step appearing while the page is open. Any JavaScript error in the console fails it.

Set GW_DASHBOARD_SCREENSHOTS=DIR to save a screenshot of each view there (docs/img holds the README's).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dash_helpers import write_step, write_stop
from groupwise.runs.store import RunStore

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):  # .ci/run installs them: missing there is a broken CI, not a skip
        raise RuntimeError(f"{CHROMIUM} and {CHROMEDRIVER} are needed (apt-get install chromium chromium-driver)")
    pytest.skip("needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)",
                allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SHOTS = os.environ.get("GW_DASHBOARD_SCREENSHOTS")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dashboard(tmp_path):
    store = RunStore(tmp_path / "runs", "2048", "agent")
    for step in range(3):
        write_step(store, step, exception_group=1 if step == 2 else None)
    seed1 = RunStore(tmp_path / "runs", "2048", "agent-s1")  # a second seed, drawn beside it
    for step in range(2):
        write_step(seed1, step, n_groups=2)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "groupwise.cli", "dashboard", str(tmp_path / "runs"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"the dashboard did not start: {proc.stdout.read()}")
            time.sleep(0.1)
    yield url, store
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def browser(tmp_path):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)  # no selenium-manager download
    yield driver
    driver.quit()


def wait(driver, what, timeout=15):
    # the page re-renders its lists on every 2 s poll: an element found a moment ago can be replaced
    # before it is read, so a stale one means "look again", not a failure
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)).until(lambda d: what(d))


def shot(driver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"dashboard-{name}.png"))


def js(driver, code: str, *args):
    return driver.execute_script(code, *args)


# The page re-renders the runs table, a step's groups, the open trajectory and the chart markers on every
# 2 s poll, so an element selenium found can be replaced before it is used: these read and click through
# the DOM in one script call instead.
def click(driver, css: str) -> None:
    wait(driver, lambda d: js(d, "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e", css))


def attrs(driver, css: str, name: str) -> list:
    return js(driver, "return [...document.querySelectorAll(arguments[0])].map(e => e.getAttribute(arguments[1]))", css, name)


def text(driver, css: str) -> str | None:
    return js(driver, "const e = document.querySelector(arguments[0]); return e ? e.innerText : null", css)


def test_the_page_renders_every_view_and_a_new_step_appears_while_it_is_open(dashboard, browser):
    url, store = dashboard
    d = browser
    d.get(url)
    # runs: one row, training (its history was just written), latest step 2, its base and best validations
    row = 'tr.run-row[data-run="2048/models/agent"]'
    wait(d, lambda d: attrs(d, row, "data-state") == ["training"])
    assert text(d, f"{row} .latest-step") == "2"
    assert "training" in text(d, row) and "[" in text(d, row)  # a validation with its interval
    assert len(attrs(d, "tr.run-row", "data-run")) == 2
    shot(d, "runs")

    # the second seed on the shared axes
    click(d, 'tr.run-row[data-run="2048/models/agent-s1"] input[type=checkbox]')
    click(d, row)
    wait(d, lambda d: js(d, "return gw.charts.reward && gw.charts.val && gw.charts.reward.u.data[0].length") == 3)
    assert d.find_elements(By.CSS_SELECTOR, "#chart-reward canvas") and d.find_elements(By.CSS_SELECTOR, "#chart-val canvas")
    # the reward band is drawn between mean+std and mean-std, around the mean
    bands = js(d, "return gw.charts.reward.u.bands.map(b => b.series)")
    assert bands == [[2, 3]]
    mean, hi, lo = js(d, "const u = gw.charts.reward.u; return [u.data[1], u.data[2], u.data[3]]")
    assert all(lo_ < m < hi_ for m, hi_, lo_ in zip(mean, hi, lo))
    val_x, val, val_hi, val_lo, base = js(d, "const u = gw.charts.val.u; return [u.data[0], u.data[1], u.data[2], u.data[3], "
                                          "u.data[u.series.findIndex(s => s.label === 'baseline base')]]")
    assert val_x == [0, 2] and all(l <= v <= h for v, h, l in zip(val, val_hi, val_lo)) and base == [val[0]] * 2
    labels, other = js(d, "const u = gw.charts.reward.u; return [u.series.map(s => s.label), u.data[4]]")
    assert labels[4] == "2048/models/agent-s1 reward" and other[:2] == [x for x in js(d, "return gw.curves['2048/models/agent-s1'].train.reward")]
    assert other[2] is None  # the second seed has no step 2: a gap on the shared axis
    for chart in ("loss", "kl", "grad", "tokens", "phases", "judge"):  # the judge's comes a moment later
        wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, f"#chart-{chart} canvas"))
    assert js(d, "return gw.charts.judge.u.data") == [[0, 2], [1, 1]]
    # the trainer's curves of both runs on one step axis too (the second seed has no step 2: a gap)
    labels, data = js(d, "const u = gw.charts.kl.u; return [u.series.map(s => s.label), u.data]")
    assert labels == ["step", "2048/models/agent kl", "2048/models/agent-s1 kl"] and data == [[0, 1, 2], [0, 0.001, 0.002], [0, 0.001, None]]
    marker = '#chart-reward .alert-marker[data-step="2"]'
    wait(d, lambda d: attrs(d, marker, "data-name") == ["identical_answers"])
    assert "identical_answers" in d.find_element(By.ID, "alerts-list").text
    shot(d, "curves")

    # a step lands while the page is open: it is drawn within a few polls
    write_step(store, 3)
    wait(d, lambda d: js(d, "return gw.charts.reward.u.data[0]") == [0, 1, 2, 3], timeout=20)

    # the alert's marker opens its evidence: the group it names, at its step
    click(d, marker)
    cards = '.group.highlight[data-group="1"] .traj-card'
    wait(d, lambda d: len(attrs(d, cards, "data-reward")) == 4)
    rewards = [float(r) for r in attrs(d, cards, "data-reward")]
    assert rewards == sorted(rewards, reverse=True)
    assert "1 exception(s)" in text(d, '.group.highlight[data-group="1"] .group-head')
    assert js(d, "return document.querySelector('.group.highlight .group-exceptions').textContent").endswith(
        "TimeoutError: rollout 4 of group 1 timed out")
    assert d.find_element(By.CSS_SELECTOR, "#filters select[name=step]").get_attribute("value") == "2"
    click(d, cards)
    wait(d, lambda d: attrs(d, "#trajectory .tok[data-loss]", "data-loss"))
    assert attrs(d, "#trajectory .tok[data-loss]", "data-loss") == ["forced"] + ["trained"] * 4 + ["forced"]
    shown = text(d, "#trajectory").lower()  # roles are upper-cased by the style
    assert "make_move(" in shown and "judge: trajectory 3 scored 0.41" in shown and "result of call_2_1_3" in shown
    shot(d, "rollouts")
    click(d, "#trajectory input[value=logprob]")  # coloured by logprob
    wait(d, lambda d: all(js(d, "return [...document.querySelectorAll('#trajectory .tok[data-loss]')].map(t => t.style.background)")))
    click(d, "#trajectory input[value=advantage]")  # by advantage: the trained ones only
    wait(d, lambda d: js(d, "return [...document.querySelectorAll('#trajectory .tok[data-loss]')].map(t => t.style.background !== '')")
         == [False] + [True] * 4 + [False])

    # filters: text search over every step
    f = d.find_element(By.ID, "filters")
    f.find_element(By.NAME, "q").send_keys("final answer 0 for scenario 2")
    f.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    results = wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "#search-results .result-row"))
    assert len(results) == 4 and all("group 2 · #0" in r.text for r in results)
    d.find_element(By.ID, "worst-of-step").click()  # the step shown: 2
    wait(d, lambda d: "12 rollouts match" in d.find_element(By.ID, "search-results").text)
    first = d.find_elements(By.CSS_SELECTOR, "#search-results .result-row")[0].text
    assert first.startswith("train step 2 · group 0 · #0 · reward 0.100"), first

    # the same scenarios at two steps
    d.find_element(By.CSS_SELECTOR, '#tabs button[data-view="compare"]').click()
    rows = wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "#compare tr.cmp-row"))
    assert len(rows) == 3 and "step 0" in d.find_element(By.ID, "compare").text
    shot(d, "compare")

    # the loop stops: the stop is drawn on the timeline, and the run is listed as stopped, with its rule
    write_stop(store, 3, best_step=2)
    d.find_element(By.CSS_SELECTOR, '#tabs button[data-view="curves"]').click()
    wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-reward .stop-marker"))
    assert "stopped at step 3 (max_steps)" in d.find_element(By.ID, "stop-line").text
    # the stop opens its evidence: the validation scenarios at step 0 against the best step it kept
    d.execute_script("document.getElementById('compare').replaceChildren()")  # the compare drawn before
    click(d, "#chart-reward .stop-marker")
    assert d.find_element(By.CSS_SELECTOR, "#compare-form input[name=b]").get_attribute("value") == "best"
    wait(d, lambda d: [th.text for th in d.find_elements(By.CSS_SELECTOR, "#compare th")] == ["scenario", "step 0", "step 2"])
    assert len(d.find_elements(By.CSS_SELECTOR, "#compare tr.cmp-row")) == 3
    d.find_element(By.CSS_SELECTOR, '#tabs button[data-view="runs"]').click()
    wait(d, lambda d: attrs(d, row, "data-state") == ["stopped"])

    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors
