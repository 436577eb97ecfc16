"""How big the interactive pages are and how fast they load and redraw in a real browser; and the same Gantt
drawn by Plotly's offline bundle, the maintained library we measured against (issue 24, item 3).

    python benchmarks/bench_pages.py                       # figures; needs chromium + chromium-driver + selenium
    python benchmarks/bench_pages.py --screenshots reports/pages   # also keep screenshots of every page
    python benchmarks/bench_pages.py --no-plotly           # skip the comparison (plotly not installed)

Prints, each with the machine's load average: page sizes, generation time, load time in the browser (to
window.pipesim.loaded), the playground's redraw time at K=8, M=32 (median of 15 redraws: simulate + draw),
and a K=64, M=1024 timeline's full-view and zoomed redraws. With plotly installed (``pip install plotly``),
the same K=8, M=32 Gantt and the K=64, M=1024 one as Plotly bar charts: page size, load and redraw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sim
from sim import schedules
from sim.io.pages import playground_page, timeline_page, write_page


def load() -> str:
    return open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome")
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,1400"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.set_script_timeout(300)
    return driver


def open_page(driver, path: Path, ready: str = "window.pipesim && window.pipesim.loaded") -> float:
    t0 = time.perf_counter()
    driver.get(path.resolve().as_uri())
    while not driver.execute_script(f"return !!({ready})"):
        time.sleep(0.01)
        if time.perf_counter() - t0 > 120:
            raise TimeoutError(path)
    return time.perf_counter() - t0


def report(what: str, value: str) -> None:
    print(f"{what:<58} {value:>16}   load {load()}")


def run(K: int, M: int):
    s = schedules.generate("1f1b", K, M)
    costs = sim.uniform(K, forward=1e-3, backward=2e-3, activation_bytes=4e6, send_bytes=4e6)
    return sim.simulate(s, costs, sim.Hardware(devices=K, latency=2e-5, bandwidth=1e10))


def ours(driver, folder: Path, shots: Path | None) -> None:
    t0 = time.perf_counter()
    text = playground_page()
    report("playground: generate (K<=8, M<=32, every schedule)", f"{time.perf_counter() - t0:.2f} s")
    path = write_page(text, folder / "playground.html")
    report("playground: page size", f"{path.stat().st_size / 1e6:.2f} MB")
    report("playground: load in the browser", f"{open_page(driver, path) * 1e3:.0f} ms")
    driver.execute_script("const k = document.getElementById('ps-K'); k.value = '8'; k.dispatchEvent(new Event('input'));"
                          "const m = document.getElementById('ps-M'); m.value = m.max; m.dispatchEvent(new Event('input'));")
    times = driver.execute_script("return Array.from({length: 15}, () => window.pipesim.redraw())")
    report("playground: redraw K=8 M=32, 1f1b vs gpipe (median of 15)", f"{statistics.median(times):.1f} ms")
    one = driver.execute_script("const t = performance.now(); for (let i = 0; i < 50; i++) window.pipesim.simulate("
                                "{schedule: 'zb-h1', K: 8, M: 32, latency: 0.01, bandwidth: 1e7, activation_bytes: 1e6});"
                                " return (performance.now() - t) / 50")
    report("playground: pipesim.simulate zb-h1 K=8 M=32 (JS, mean of 50)", f"{one:.2f} ms")
    if shots:
        driver.save_screenshot(str(shots / "playground.png"))
    big = run(64, 1024)
    t0 = time.perf_counter()
    text = timeline_page(big)
    report("timeline K=64 M=1024: generate", f"{time.perf_counter() - t0:.2f} s")
    path = write_page(text, folder / "big.html")
    report("timeline K=64 M=1024: page size", f"{path.stat().st_size / 1e6:.2f} MB")
    report("timeline K=64 M=1024: load in the browser", f"{open_page(driver, path) * 1e3:.0f} ms")
    full = driver.execute_script("return Array.from({length: 7}, () => window.pipesim.zoom(0, window.pipesim.view.tmax))")
    report("timeline K=64 M=1024: redraw, whole run (median of 7)", f"{statistics.median(full):.1f} ms")
    zoomed = driver.execute_script("return Array.from({length: 7}, (_, i) => window.pipesim.zoom(1 + i * 0.1, 1.02 + i * 0.1))")
    report("timeline K=64 M=1024: redraw, 20 ms window (median of 7)", f"{statistics.median(zoomed):.1f} ms")
    if shots:
        driver.execute_script("window.pipesim.zoom(0, window.pipesim.view.tmax)")
        driver.save_screenshot(str(shots / "timeline_K64_M1024.png"))


def plotly_page(result, folder: Path, name: str) -> Path:
    """The Gantt as Plotly horizontal bars (one trace per op, base = start), its bundle inlined: what a page built
    on Plotly's offline output would hold."""
    import plotly.offline

    tl = result.timeline
    comp = tl[tl["src"] < 0]
    traces = [{"type": "bar", "orientation": "h", "name": op, "y": rows["device"].tolist(),
               "x": (rows["end"] - rows["start"]).tolist(), "base": rows["start"].tolist(),
               "customdata": rows["microbatch"].tolist(), "hovertemplate": op + "%{customdata}<extra></extra>"}
              for op, rows in comp.groupby("op", observed=True)]
    html = f"""<!DOCTYPE html><html><head><meta charset="utf-8"></head><body><div id="g" style="width:1200px;height:700px"></div>
<script>{plotly.offline.get_plotlyjs()}</script>
<script>const traces = {json.dumps(traces)};
const layout = {{barmode: "overlay", yaxis: {{autorange: "reversed"}}, showlegend: true}};
const t0 = performance.now();
Plotly.newPlot("g", traces, layout).then(() => {{ window.firstDraw = performance.now() - t0; window.done = true; }});
window.redraw = async () => {{ const t = performance.now(); const x = traces.map((tr) => Object.assign({{}}, tr, {{base: tr.base.map((b) => b * 1.01)}}));
  await Plotly.react("g", x, layout); return performance.now() - t; }};
</script></body></html>"""
    path = folder / name
    path.write_text(html)
    return path


def theirs(driver, folder: Path) -> None:
    try:
        import plotly
    except ImportError:
        print("plotly not installed: comparison skipped (pip install plotly)")
        return
    for K, M in ((8, 32), (64, 1024)):
        path = plotly_page(run(K, M), folder, f"plotly_{K}_{M}.html")
        report(f"plotly {plotly.__version__} Gantt K={K} M={M}: page size", f"{path.stat().st_size / 1e6:.2f} MB")
        report(f"plotly Gantt K={K} M={M}: load + first draw", f"{open_page(driver, path, 'window.done') * 1e3:.0f} ms")
        times = [driver.execute_async_script("window.redraw().then(arguments[0])") for _ in range(3 if K > 8 else 15)]
        report(f"plotly Gantt K={K} M={M}: redraw (Plotly.react, median)", f"{statistics.median(times):.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--screenshots", metavar="DIR", help="keep screenshots here")
    parser.add_argument("--no-plotly", action="store_true", help="skip the Plotly comparison")
    args = parser.parse_args()
    shots = Path(args.screenshots) if args.screenshots else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    driver = browser()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            ours(driver, Path(tmp), shots)
            if not args.no_plotly:
                theirs(driver, Path(tmp))
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
