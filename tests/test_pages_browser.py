"""The interactive pages in a real browser: headless Chromium driven by selenium, one browser for the module.

- the playground loads with no console error and no network request (the page's only request is itself);
- ``window.pipesim.simulate`` equals ``pipesim simulate`` on hundreds of random configurations, every registered
  schedule, links on and off: the page's "copy command" line is parsed by the real CLI parser and simulated;
- moving a control (a key press on the M slider) redraws a different figure; the playground's hover gives the
  same wait split as a timeline page of the same run;
- a timeline report (predicted above measured) and a K=64, M=1024 run load, zoom and answer a hover;
- screenshots of the playground and of the report are written (``PIPESIM_SCREENSHOTS=DIR`` keeps them).

Skipped, saying why, where Chromium, its driver or selenium is missing (``make test`` installs them with apt).
"""

from __future__ import annotations

import json
import math
import os
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import sim
from sim import schedules
from sim.cli import build_parser
from sim.cli.simulate import simulate_from_args
from sim.io.pages import playground_page, timeline_page, write_page
from sim.results.result import make_result
from sim.schedules import registry
from sim.schedules.closed_forms import closed_form_utilization

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (BROWSER and DRIVER), reason="no headless Chromium: install Debian's chromium and "
                                "chromium-driver (make test does where apt is available)")

PARITY_CONFIGS = 240


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1400",
                 "--disable-extensions", "--no-first-run"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_script_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pages")
    return {"playground": write_page(playground_page(), folder / "playground.html")}


def open_page(driver, path: Path) -> dict:
    """Load *path*; wait for window.pipesim; return what the browser logged and requested meanwhile."""
    driver.get_log("browser"), driver.get_log("performance")  # drop what earlier pages left
    t0 = time.perf_counter()
    driver.get(path.resolve().as_uri())
    for _ in range(400):
        state = driver.execute_script("return window.pipesim && (window.pipesim.loaded || window.pipesim.error || null)")
        if state:
            break
        time.sleep(0.025)
    assert state is True, f"the page did not load: {state}"
    load = time.perf_counter() - t0
    events = [json.loads(e["message"])["message"] for e in driver.get_log("performance")]
    requests = [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]
    return {"console": driver.get_log("browser"), "requests": requests, "load_s": load}


def screenshot(driver, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("PIPESIM_SCREENSHOTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    assert driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a drawn page, not a blank one
    return path


def test_playground_loads_offline_without_errors(browser, pages, tmp_path):
    seen = open_page(browser, pages["playground"])
    errors = [e for e in seen["console"] if e["level"] in ("SEVERE", "WARNING")]
    assert not errors, errors
    assert seen["requests"] == [pages["playground"].resolve().as_uri()]  # itself, nothing else
    status = browser.find_element("id", "ps-status").text
    assert status.startswith("redrawn in"), status
    screenshot(browser, "playground.png", tmp_path)


def _random_configs(driver, count: int, seed: int = 24) -> list[dict]:
    """Random configurations over the page's grid: every schedule, links on and off, memory on and off."""
    grid = driver.execute_script("return window.pipesim.configs()")
    by_name: dict[str, list[dict]] = {}
    for c in grid:
        by_name.setdefault(c["schedule"], []).append(c)
    assert sorted(by_name) == sorted(registry.names())  # every registered schedule is in the page
    rng = random.Random(seed)
    names = sorted(by_name)
    out = []
    for i in range(count):
        cfg = dict(rng.choice(by_name[names[i % len(names)]]))  # round robin: each schedule equally often
        cfg["forward"] = rng.choice([1.0, 0.5, round(rng.uniform(0.01, 3), 3), rng.uniform(0.001, 2)])
        cfg["backward"] = rng.choice([2.0, round(rng.uniform(0.01, 4), 3), rng.uniform(0.001, 3)])
        cfg["weight"] = rng.choice([0.0, 0.0, 1.0, round(rng.uniform(0, 2), 2), rng.uniform(0, 1)])
        links = i % 2 == 1  # links on for half of them
        cfg["latency"] = rng.choice([0.0, 0.05, rng.uniform(0, 0.5)]) if links else 0.0
        cfg["bandwidth"] = rng.choice([1e6, 2.5e7, rng.uniform(1e5, 1e8)]) if links else math.inf
        cfg["activation_bytes"] = rng.choice([0.0, 1e6, rng.uniform(0, 4e6)]) if links or rng.random() < 0.3 else 0.0
        cfg["weight_bytes"] = rng.choice([0.0, 3e6])
        out.append(cfg)
    return out


def test_page_simulate_equals_pipesim_simulate(browser, pages):
    """window.pipesim.simulate against `pipesim simulate` as the page's copy-command line runs it (the same floats),
    and the page's closed forms against sim.schedules.closed_forms."""
    open_page(browser, pages["playground"])
    configs = _random_configs(browser, PARITY_CONFIGS)
    answers = browser.execute_script(
        "return arguments[0].map((c) => { const js = Object.assign({}, c);"
        " if (js.bandwidth === null) js.bandwidth = Infinity;"
        " return [window.pipesim.simulate(js), window.pipesim.command(js), window.pipesim.closedForm(js)]; })",
        [dict(c, bandwidth=None if c["bandwidth"] == math.inf else c["bandwidth"]) for c in configs])
    checked, links_on, names = 0, 0, set()
    for cfg, (got, line, closed) in zip(configs, answers):
        argv = shlex.split(line)
        assert argv[:2] == ["pipesim", "simulate"]
        args = build_parser("simulate").parse_args(argv[1:])
        want = simulate_from_args(args).metrics
        where = f"{line}: page {got} vs pipesim {want}"
        assert got["makespan"] == want.makespan, where  # the same floats, not approximately
        assert got["bubble_fraction"] == want.bubble_fraction, where
        assert got["peak_inflight"] == want.peak_inflight, where
        assert got["peak_memory"] == want.peak_memory, where
        assert got["weight_versions"] == want.weight_versions, where
        assert got["bubble_rate_zb"] == want.bubble_rate_zb, where
        formula = closed_form_utilization(cfg["schedule"], devices=cfg["K"], microbatches=cfg["M"], chunks=cfg["chunks"],
                                          forward=cfg["forward"], backward=cfg["backward"], weight=cfg["weight"])
        assert (closed is None and math.isnan(formula)) or closed == formula, f"{line}: closed form {closed} vs {formula}"
        checked += 1
        links_on += cfg["latency"] > 0 or cfg["bandwidth"] != math.inf
        names.add(cfg["schedule"])
    assert checked >= 200 and links_on >= 100 and names == set(registry.names())


def test_page_refuses_what_pipesim_refuses(browser, pages):
    open_page(browser, pages["playground"])
    message = browser.execute_script(
        "try { window.pipesim.simulate({schedule: 'interleaved-1f1b', K: 3, M: 4}); return null; }"
        " catch (e) { return e.message; }")
    assert message and "multiple" in message


def _canvas(driver):
    return driver.execute_script("return document.querySelector('#ps-charts canvas').toDataURL()")


def test_moving_a_control_redraws(browser, pages, tmp_path):
    from selenium.webdriver.common.keys import Keys

    open_page(browser, pages["playground"])
    before, figures = _canvas(browser), browser.find_element("id", "ps-figures").text
    slider = browser.find_element("id", "ps-M")
    slider.send_keys(Keys.ARROW_RIGHT)  # M 8 -> 9, as a user's key press
    assert browser.find_element("id", "ps-M-value").text == "9"
    assert _canvas(browser) != before
    assert browser.find_element("id", "ps-figures").text != figures
    # K=8, M=32: the redraw the issue times (measured in benchmarks/bench_pages.py; here only that it happens)
    browser.execute_script("const k = document.getElementById('ps-K'); k.value = '8';"
                           "k.dispatchEvent(new Event('input'));"
                           "const m = document.getElementById('ps-M'); m.value = String(m.max);"
                           "m.dispatchEvent(new Event('input'));")
    assert browser.find_element("id", "ps-M-value").text == "32"
    assert browser.execute_script("return window.pipesim.redraw()") > 0
    screenshot(browser, "playground_K8_M32.png", tmp_path)


def _validation_like_results():
    """A predicted run and a 'measured' one of the same schedule (runtime overhead added, links slower), as a
    validation report holds them."""
    s = schedules.generate("1f1b", 4, 8)
    costs = sim.uniform(4, forward=1e-3, backward=2e-3, activation_bytes=4e6, send_bytes=4e6)
    predicted = sim.simulate(s, costs, sim.Hardware(devices=4, latency=2e-5, bandwidth=1e10))
    tl = predicted.timeline.sort_values(["device", "start"]).reset_index(drop=True)
    rng = np.random.default_rng(1)
    comp = (tl["src"] < 0).to_numpy()
    shift = np.zeros(len(tl))
    for d in range(4):
        rows = np.flatnonzero(comp & (tl["device"] == d).to_numpy())
        shift[rows] = np.cumsum(rng.random(len(rows)) * 2e-4)
    tl["start"] += shift
    tl["end"] += shift
    measured = make_result(s, costs, predicted.hardware, tl, source="measured")
    return predicted, measured


def test_report_page_zooms_and_hovers(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    predicted, measured = _validation_like_results()
    path = write_page(timeline_page([predicted, measured], titles=["predicted", "measured"],
                                    heading="validate 1f1b K=4 M=8"), tmp_path / "report.html")
    seen = open_page(browser, path)
    assert not [e for e in seen["console"] if e["level"] == "SEVERE"] and len(seen["requests"]) == 1
    canvases = browser.find_elements("css selector", "canvas")
    assert len(canvases) == 4  # two Gantts, two memory panels
    # the axes are linked: zooming changes every panel
    before = [browser.execute_script("return arguments[0].toDataURL()", c) for c in canvases]
    browser.execute_script("window.pipesim.zoom(0.005, 0.015)")
    after = [browser.execute_script("return arguments[0].toDataURL()", c) for c in canvases]
    assert all(a != b for a, b in zip(before, after))
    # hover the measured Gantt's device 0: the tooltip names the action and its wait split
    browser.execute_script("window.pipesim.zoom(0, window.pipesim.view.tmax)")
    gantt = canvases[1]
    t = float(measured.timeline.query("device == 0 and op == 'B'")["start"].iloc[3]) + 1e-4
    x = browser.execute_script("const p = window.pipesim.view.panels[1]; return p.x(arguments[0]);", t)
    y = browser.execute_script("const p = window.pipesim.view.panels[1]; return p.rowY(0) + 3;")
    ActionChains(browser).move_to_element_with_offset(gantt, int(x - gantt.size["width"] / 2),
                                                      int(y - gantt.size["height"] / 2)).perform()
    tip = browser.find_element("css selector", ".ps-tooltip")
    assert tip.is_displayed() and "micro-batch" in tip.text and "dependency" in tip.text, tip.text
    screenshot(browser, "validation_report.png", tmp_path)


@pytest.mark.slow
def test_a_64_rank_run_stays_drawable(browser, tmp_path):
    s = schedules.generate("1f1b", 64, 1024)
    costs = sim.uniform(64, forward=1e-3, backward=2e-3, activation_bytes=4e6, send_bytes=4e6)
    result = sim.simulate(s, costs, sim.Hardware(devices=64, latency=2e-5, bandwidth=1e10))
    path = write_page(timeline_page(result), tmp_path / "big.html")
    seen = open_page(browser, path)
    assert not [e for e in seen["console"] if e["level"] == "SEVERE"]
    full = browser.execute_script("return window.pipesim.lastDrawMs")
    zoomed = browser.execute_script("return window.pipesim.zoom(1.0, 1.01)")
    assert full > 0 and zoomed > 0  # drawn; the times themselves are benchmarks/bench_pages.py's
    screenshot(browser, "timeline_K64_M1024.png", tmp_path)


def test_the_request_check_sees_a_request(browser, tmp_path):
    """Injected bug: a page that tries to reach the network. The browser refuses it (the page's policy) and the
    checks above see it, so their 'no request, no console error' cannot pass by accident."""
    from sim.io.pages.html import render
    from sim.io.pages.payload import pack

    page = render(title="t", heading="t", scripts=["data.js"], payload=pack({}),
                  start="(root, id) => fetch('http://127.0.0.1:9/x').catch(() => null).then(() => ({}))")
    seen = open_page(browser, write_page(page, tmp_path / "leaky.html"))
    blocked = [e for e in seen["console"] if "Content Security Policy" in e["message"]]
    assert blocked or len(seen["requests"]) > 1, seen


def test_sweep_page_answers_a_hover(browser, tmp_path):
    import pandas as pd

    from selenium.webdriver.common.action_chains import ActionChains
    from sim.io.pages import sweep_page

    df = pd.DataFrame({"schedule": ["1f1b"] * 3, "devices": [4, 4, 4], "microbatches": [1, 4, 16],
                       "utilization": [0.25, 4 / 7, 16 / 19], "closed_form_utilization": [0.25, 4 / 7, 16 / 19],
                       "makespan": [12.0, 21.0, 57.0], "error": ["", "", ""]})
    seen = open_page(browser, write_page(sweep_page(df), tmp_path / "sweep.html"))
    assert not [e for e in seen["console"] if e["level"] == "SEVERE"]
    canvas = browser.find_element("css selector", "canvas")
    x, y = browser.execute_script("const c = window.pipesim.charts[0]; return [c.x(4), c.y(4 / 7)];")
    ActionChains(browser).move_to_element_with_offset(canvas, int(x - canvas.size["width"] / 2),
                                                      int(y - canvas.size["height"] / 2)).perform()
    tip = browser.find_element("css selector", ".ps-tooltip")
    assert tip.is_displayed() and "K=4, M=4" in tip.text and "makespan: 21" in tip.text, tip.text


def _neumaier(values):
    """CPython 3.12's sum() of floats (Python/bltinmodule.c): Neumaier's compensated sum; the builtin itself from 3.12."""
    if sys.version_info >= (3, 12):
        return sum(values)
    total, c = 0 + values[0], 0.0
    for x in values[1:]:
        t = total + x
        c += (total - t) + x if abs(total) >= abs(x) else (x - t) + total
        total = t
    return total + c if c and math.isfinite(c) else total


def test_the_page_adds_busy_times_as_python_does(browser, pages):
    """The page mirrors the Python that wrote it: plain addition up to 3.11, compensated from 3.12 (both checked)."""
    open_page(browser, pages["playground"])
    rng = random.Random(5)
    for _ in range(20):
        values = [rng.choice([1e16, 1.0, -1e16, 0.1, rng.uniform(0, 3)]) for _ in range(rng.randint(1, 30))]
        plain, compensated = browser.execute_script(
            "return [PS.engine.pySum(arguments[0], false), PS.engine.pySum(arguments[0], true)]", values)
        loop = values[0]
        for x in values[1:]:
            loop += x
        assert plain == loop and compensated == _neumaier(values), values


@pytest.mark.parametrize("name", ["1f1b", "zbv", "dualpipev"])
def test_the_playground_waits_are_the_reports(browser, pages, name):
    """The playground's hover (wait split computed in the page) says what a timeline page of the same run says."""
    from sim.io.pages.timelines import run_document

    open_page(browser, pages["playground"])
    cfg = {"schedule": name, "K": 4, "M": 8, "latency": 0.3, "bandwidth": 2e6, "activation_bytes": 1e6}
    js = browser.execute_script("return window.pipesim.timeline(arguments[0])", cfg)
    line = browser.execute_script("return window.pipesim.command(arguments[0])", cfg)
    doc = run_document(simulate_from_args(build_parser("simulate").parse_args(shlex.split(line)[1:])))
    comp = doc["comp"]
    assert js["devStart"] == comp["devStart"].tolist()
    for d in range(4):
        a, b = js["devStart"][d], js["devStart"][d + 1]
        for key, column in (("dependency", "wait_dependency"), ("communication", "wait_communication"),
                            ("gap", "wait_gap")):
            assert sum(js[key][a:b]) == pytest.approx(float(comp[column][a:b].sum()), abs=1e-9), (d, key)
    assert sum(js["communication"]) > 0  # slow links: some of the waiting is for transfers
