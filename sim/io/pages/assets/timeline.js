/* Canvas drawing of timelines: Gantt panels (one row per device, transfers in a thin lane under it) and memory
 * panels (bytes per device over time), all on one shared, zoomable time axis.
 *
 * Why canvas and not SVG or a charting library: a 64-rank run of 1,024 micro-batches has 131 k computations and
 * as many transfers; SVG keeps one DOM node per box and a general charting library one object per box, while a
 * canvas redraws only what is visible. When boxes get narrower than two pixels (zoomed out), each row is drawn
 * per pixel column instead, in the colour of the op that covers most of that column ("decimation"): a redraw
 * then costs O(visible boxes + width x rows), whatever the run's size. benchmarks/bench_pages.py measures it.
 *
 * Colours: sim/io/plots.py's COLORS (the Okabe-Ito palette), later model chunks of a device in lighter tints,
 * as the PNG Gantt draws them.
 */
(function (PS) {
  "use strict";

  const OPS = ["F", "B", "W", "R", "U", "SEND_F", "SEND_B"];
  const COLORS = {F: "#56B4E9", B: "#E69F00", W: "#009E73", R: "#CC79A7", U: "#000000", SEND_F: "#0072B2",
    SEND_B: "#D55E00"};
  const NAMES = {F: "forward", B: "backward", W: "weight gradient", R: "recompute", U: "update",
    SEND_F: "send activation", SEND_B: "send gradient"};
  const MAX_CHUNKS = 8;
  const LEFT = 58, RIGHT = 12, AXIS = 22;

  function hexRgb(hex) {
    const v = parseInt(hex.slice(1), 16);
    return [(v >> 16) & 255, (v >> 8) & 255, v & 255];
  }

  /* colour of op index k, chunk c of `chunks` (chunk 0: the op's colour; later ones mixed with white, up to 60%) */
  function tint(k, c, chunks) {
    const rgb = hexRgb(COLORS[OPS[k]] || "#999999");
    const amount = chunks > 1 ? 0.6 * c / (chunks - 1) : 0;
    return `rgb(${rgb.map((x) => Math.round(x + (255 - x) * amount)).join(",")})`;
  }

  function textOn(k, c, chunks) { // black or white, whichever reads better (WCAG relative luminance)
    const rgb = hexRgb(COLORS[OPS[k]] || "#999999").map((x) => {
      const amount = chunks > 1 ? 0.6 * c / (chunks - 1) : 0;
      const v = (x + (255 - x) * amount) / 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    });
    const lum = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2];
    return lum > 0.179 ? "#000" : "#fff";
  }

  /* a time unit for a span of `span` seconds: s, ms or µs, as the PNG Gantt chooses it (sim/io/plots.py) */
  function timeUnit(span) {
    if (span >= 1) return {name: "s", scale: 1};
    if (span >= 1e-3) return {name: "ms", scale: 1e3};
    return {name: "µs", scale: 1e6};
  }

  function fmt(x, digits) {
    if (!Number.isFinite(x)) return String(x);
    const a = Math.abs(x);
    if (a !== 0 && (a >= 1e6 || a < 1e-3)) return x.toExponential(digits === undefined ? 3 : digits);
    return String(Number(x.toPrecision(digits === undefined ? 6 : digits)));
  }

  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let u = 0;
    while (Math.abs(n) >= 1024 && u < units.length - 1) { n /= 1024; u++; }
    return u === 0 ? `${Math.round(n)} B` : `${n.toFixed(1)} ${units[u]}`;
  }

  function niceStep(span, target) {
    const raw = span / Math.max(1, target), p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  /* first index i in [lo, hi) with arr[i] > value (arr sorted ascending) */
  function upper(arr, value, lo, hi) {
    while (lo < hi) { const mid = (lo + hi) >> 1; if (arr[mid] > value) hi = mid; else lo = mid + 1; }
    return lo;
  }

  function hatch() {
    const c = document.createElement("canvas");
    c.width = c.height = 6;
    const g = c.getContext("2d");
    g.fillStyle = "#fff"; g.fillRect(0, 0, 6, 6);
    g.strokeStyle = "#c8c8c8"; g.lineWidth = 1;
    g.beginPath(); g.moveTo(0, 6); g.lineTo(6, 0); g.moveTo(-1, 1); g.lineTo(1, -1); g.moveTo(5, 7); g.lineTo(7, 5);
    g.stroke();
    return c;
  }

  /* Shared view of several panels: the visible time range [t0, t1] of a full range [0, tmax]. */
  class View {
    constructor() { this.panels = []; this.tmax = 1; this.t0 = 0; this.t1 = 1; this.listeners = []; }
    add(panel) { this.panels.push(panel); panel.view = this; }
    clear() { this.panels.forEach((p) => p.destroy()); this.panels = []; }
    fit(tmax) {
      this.tmax = tmax > 0 ? tmax : 1;
      this.t0 = 0; this.t1 = this.tmax;
    }
    set(t0, t1) {
      const span = Math.min(Math.max(t1 - t0, this.tmax * 1e-9), this.tmax * 1.05);
      t0 = Math.min(Math.max(t0, -this.tmax * 0.025), this.tmax * 1.025 - span);
      this.t0 = t0; this.t1 = t0 + span;
      this.draw();
    }
    zoom(factor, at) { this.set(at - (at - this.t0) * factor, at + (this.t1 - at) * factor); }
    draw() {
      const t = performance.now();
      this.panels.forEach((p) => { const a = performance.now(); p.draw(); p.lastDrawMs = performance.now() - a; });
      this.lastDrawMs = performance.now() - t;
      this.listeners.forEach((f) => f(this));
    }
  }

  /* What panels share: a canvas sized to its container, pan by dragging, zoom by the wheel, reset by double-click,
   * and a tooltip. */
  class Panel {
    constructor(container, height, tooltip) {
      this.canvas = document.createElement("canvas");
      this.canvas.className = "ps-canvas";
      container.appendChild(this.canvas);
      this.container = container;
      this.height = height;
      this.tooltip = tooltip;
      this.resize();
      const c = this.canvas;
      c.addEventListener("wheel", (e) => {
        e.preventDefault();
        const v = this.view;
        v.zoom(Math.exp(Math.max(-1, Math.min(1, e.deltaY * 0.002))), this.timeAt(e.offsetX));
      }, {passive: false});
      c.addEventListener("mousedown", (e) => { this.drag = {x: e.clientX, t0: this.view.t0, t1: this.view.t1}; });
      window.addEventListener("mouseup", () => { this.drag = null; });
      window.addEventListener("mousemove", (e) => {
        if (!this.drag) return;
        const dt = (e.clientX - this.drag.x) / this.scale();
        this.view.set(this.drag.t0 - dt, this.drag.t1 - dt);
      });
      c.addEventListener("dblclick", () => this.view.set(0, this.view.tmax));
      c.addEventListener("mousemove", (e) => this.hover(e));
      c.addEventListener("mouseleave", () => { this.tooltip.style.display = "none"; });
    }
    destroy() { this.canvas.remove(); }
    resize() {
      const ratio = window.devicePixelRatio || 1;
      const style = getComputedStyle(this.container); // the canvas fills the container inside its padding
      const inner = this.container.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
      this.width = Math.max(300, Math.floor(inner) || 800);
      this.canvas.width = Math.round(this.width * ratio);
      this.canvas.height = Math.round(this.height * ratio);
      this.canvas.style.width = `${this.width}px`;
      this.canvas.style.height = `${this.height}px`;
      this.ctx = this.canvas.getContext("2d");
      this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    }
    scale() { return (this.width - LEFT - RIGHT) / (this.view.t1 - this.view.t0); }
    x(t) { return LEFT + (t - this.view.t0) * this.scale(); }
    timeAt(px) { return this.view.t0 + (px - LEFT) / this.scale(); }
    axis(y) {
      const g = this.ctx, v = this.view, unit = timeUnit(v.tmax);
      const step = niceStep((v.t1 - v.t0) * unit.scale, (this.width - LEFT - RIGHT) / 90) / unit.scale;
      g.fillStyle = "#333"; g.strokeStyle = "#999"; g.font = "11px sans-serif"; g.textAlign = "center";
      g.beginPath(); g.moveTo(LEFT, y + 0.5); g.lineTo(this.width - RIGHT, y + 0.5); g.stroke();
      for (let t = Math.ceil(v.t0 / step) * step; t <= v.t1; t += step) {
        const x = Math.round(this.x(t)) + 0.5;
        g.beginPath(); g.moveTo(x, y); g.lineTo(x, y + 4); g.stroke();
        g.fillText(fmt(t * unit.scale, 4), x, y + 15);
      }
      g.textAlign = "left";
      g.fillText(unit.name, 4, y + 15);
    }
    showTip(e, html) {
      const tip = this.tooltip;
      tip.innerHTML = html;
      tip.style.display = "block";
      const w = tip.offsetWidth;
      tip.style.left = `${Math.min(e.pageX + 14, window.scrollX + document.documentElement.clientWidth - w - 8)}px`;
      tip.style.top = `${e.pageY + 14}px`;
    }
  }

  /* One run's Gantt chart. data: {K, chunks, makespan, comp: {devStart, start, end, op, stage, mb, chunk,
   * [wait_dependency, wait_communication, wait_gap]}, xfer: {srcStart, start, end, op, stage, mb, dst, bytes} | null,
   * deviceLabel: optional function}. Computations of a device never overlap and are sorted by start. */
  class GanttPanel extends Panel {
    constructor(container, data, tooltip) {
      const K = data.K, rowH = Math.max(5, Math.min(24, Math.floor(560 / K)));
      const lane = data.xfer && data.xfer.start.length ? Math.max(2, Math.round(rowH * 0.3)) : 0;
      super(container, 6 + K * (rowH + lane + (rowH > 8 ? 2 : 0)) + AXIS, tooltip);
      this.data = data; this.rowH = rowH; this.lane = lane; this.gap = rowH > 8 ? 2 : 0;
      if (data.xfer && !data.xfer.endMax) { // one sender's transfers may overlap: the running maximum of their ends
        const x = data.xfer, m = new Float64Array(x.end.length);   // is sorted, so it bounds a binary search
        for (let d = 0; d < data.K; d++) {
          let top = -Infinity;
          for (let i = x.srcStart[d]; i < x.srcStart[d + 1]; i++) { top = Math.max(top, x.end[i]); m[i] = top; }
        }
        x.endMax = m;
      }
      this.pattern = this.ctx.createPattern(hatch(), "repeat");
      const chunks = Math.min(MAX_CHUNKS, data.chunks || 1);
      this.chunks = chunks;
      this.palette = []; this.text = []; // colour index: op * chunks + chunk
      for (let k = 0; k < OPS.length; k++) for (let c = 0; c < chunks; c++) {
        this.palette.push(tint(k, Math.min(c, chunks - 1), chunks));
        this.text.push(textOn(k, Math.min(c, chunks - 1), chunks));
      }
      this.buckets = null;
    }
    rowY(d) { return 4 + d * (this.rowH + this.lane + this.gap); }
    draw() {
      const g = this.ctx, d0 = this.data, v = this.view, W = this.width;
      g.clearRect(0, 0, W, this.height);
      const cols = Math.ceil(W - LEFT - RIGHT) + 1, NC = this.palette.length;
      if (!this.buckets || this.buckets.length < cols * NC) { this.buckets = new Float32Array(cols * NC); this.offsets = new Float32Array(cols); }
      const buckets = this.buckets, scale = this.scale(), t0 = v.t0, t1 = v.t1;
      g.font = `${Math.min(11, this.rowH - 3)}px sans-serif`;
      g.textBaseline = "middle"; g.textAlign = "center";
      g.save();
      g.beginPath(); g.rect(LEFT, 0, W - LEFT - RIGHT, this.height); g.clip();
      for (let d = 0; d < d0.K; d++) {
        const y = this.rowY(d), h = this.rowH;
        const xa = Math.max(LEFT, this.x(0)), xb = Math.min(W - RIGHT, this.x(d0.makespan));
        if (xb > xa) { g.fillStyle = this.pattern; g.fillRect(xa, y, xb - xa, h); } // idle up to the makespan
        this.drawRow(d0.comp, d0.comp.devStart[d], d0.comp.devStart[d + 1], y, h, true, buckets, cols, scale, t0, t1);
        if (this.lane && d0.xfer) {
          this.drawRow(d0.xfer, d0.xfer.srcStart[d], d0.xfer.srcStart[d + 1], y + h, this.lane, false, buckets, cols,
            scale, t0, t1);
        }
      }
      g.restore();
      g.fillStyle = "#333"; g.textAlign = "right"; g.font = `${Math.min(11, Math.max(8, this.rowH))}px sans-serif`;
      const every = Math.ceil(12 / (this.rowH + this.lane + this.gap));
      for (let d = 0; d < d0.K; d += every) {
        g.fillText(d0.deviceLabel ? d0.deviceLabel(d) : `dev ${d}`, LEFT - 6, this.rowY(d) + this.rowH / 2);
      }
      g.textBaseline = "alphabetic";
      this.axis(this.height - AXIS + 2);
    }
    /* rows lo..hi of a device (sorted by start): wide boxes drawn one by one, narrow ones binned per pixel */
    drawRow(rows, lo, hi, y, h, labels, buckets, cols, scale, t0, t1) {
      const g = this.ctx, starts = rows.start, ends = rows.end, ops = rows.op, chunk = rows.chunk, NC = this.palette.length;
      // computations do not overlap, so their ends are sorted too; for transfers, the running maximum of the ends
      let i = upper(rows.endMax || ends, t0, lo, hi);
      let touched = false, pmin = cols, pmax = -1;
      for (; i < hi; i++) {
        const s = starts[i];
        if (s > t1) break; // sorted by start
        const e = ends[i];
        if (e < t0) continue;
        const x0 = LEFT + (s - t0) * scale, x1 = LEFT + (e - t0) * scale, w = x1 - x0;
        const color = ops[i] * this.chunks + (chunk ? Math.min(chunk[i], this.chunks - 1) : 0);
        if (w >= 2) {
          g.fillStyle = this.palette[color];
          g.fillRect(x0, y, w, h);
          if (labels && w >= 6 && h >= 8) {
            g.fillStyle = "rgba(255,255,255,0.9)"; g.fillRect(x1 - 1, y, 1, h); // a thin separator
            const mb = rows.mb[i], text = w > 44 ? `${OPS[ops[i]]}${rows.stage[i]},${mb}` : `${mb}`;
            if (g.measureText(text).width + 3 < w) { g.fillStyle = this.text[color]; g.fillText(text, x0 + w / 2, y + h / 2 + 0.5); }
          }
        } else { // narrower than two pixels: add its coverage to the pixel columns it touches
          const a = Math.max(0, x0 - LEFT), b = Math.min(cols - 1, x1 - LEFT);
          let p = Math.floor(a);
          const last = Math.floor(b);
          for (; p <= last; p++) { // a zero-length box still marks its column, faintly
            const cover = Math.min(b, p + 1) - Math.max(a, p);
            buckets[p * NC + color] += Math.max(cover, 0.05);
          }
          touched = true; pmin = Math.min(pmin, Math.floor(a)); pmax = Math.max(pmax, last);
        }
      }
      if (!touched) return;
      // each pixel column stacked from the bottom: every op's share of the column in its colour, the rest idle
      const off = this.offsets, hs = h;
      const a = Math.max(0, pmin), b = Math.min(cols - 1, pmax);
      off.fill(0, a, b + 1);
      for (let c = 0; c < NC; c++) {
        let any = false, rx = -1, ry = 0, rw = 0, rh = 0; // neighbouring columns of equal segments: one rectangle
        for (let p = a; p <= b; p++) {
          const v = buckets[p * NC + c];
          if (v <= 0) continue;
          if (!any) { g.beginPath(); any = true; }
          const seg = Math.round(Math.min(v, 1 - off[p]) * hs * 2) / 2, top = y + h - Math.round(off[p] * hs * 2) / 2 - seg;
          if (seg > 0) {
            if (rx + rw === p && top === ry && seg === rh) rw++;
            else { if (rw) g.rect(LEFT + rx, ry, rw, rh); rx = p; ry = top; rw = 1; rh = seg; }
          }
          off[p] = Math.min(1, off[p] + v);
          buckets[p * NC + c] = 0;
        }
        if (rw) g.rect(LEFT + rx, ry, rw, rh);
        if (any) { g.fillStyle = this.palette[c]; g.fill(); }
      }
    }
    find(px, py) {
      const d0 = this.data, t = this.timeAt(px), slop = 3 / this.scale();
      for (let d = 0; d < d0.K; d++) {
        const y = this.rowY(d);
        if (py >= y && py < y + this.rowH) {
          const c = d0.comp, lo = c.devStart[d], hi = c.devStart[d + 1];
          const i = upper(c.end, t - slop, lo, hi);
          if (i < hi && c.start[i] <= t + slop) return {rows: c, i, device: d, transfer: false};
          return null;
        }
        if (this.lane && d0.xfer && py >= y + this.rowH && py < y + this.rowH + this.lane) {
          const x = d0.xfer;
          let best = null;
          for (let i = x.srcStart[d]; i < x.srcStart[d + 1]; i++) {
            if (x.start[i] <= t + slop && x.end[i] >= t - slop) { best = i; break; }
          }
          return best === null ? null : {rows: x, i: best, device: d, transfer: true};
        }
      }
      return null;
    }
    hover(e) {
      const hit = this.find(e.offsetX, e.offsetY);
      if (!hit) { this.tooltip.style.display = "none"; return; }
      const r = hit.rows, i = hit.i, unit = timeUnit(this.view.tmax), op = OPS[r.op[i]];
      const t = (x) => `${fmt(x * unit.scale)} ${unit.name}`;
      let html = `<b>${op}${r.stage[i]},${r.mb[i]}</b> ${NAMES[op] || op}<br>stage ${r.stage[i]} · micro-batch ${r.mb[i]}`
        + (hit.transfer ? ` · device ${hit.device} → ${r.dst[i]}` : ` · device ${hit.device}`)
        + `<br>start ${t(r.start[i])} · end ${t(r.end[i])}<br>duration ${t(r.end[i] - r.start[i])}`;
      if (hit.transfer && r.bytes) html += ` · ${fmtBytes(r.bytes[i])}`;
      if (!hit.transfer && r.wait_dependency) {
        const dep = r.wait_dependency[i], com = r.wait_communication[i], gap = r.wait_gap[i];
        html += `<br>waited before it: ${t(dep + com + gap)}<br>&nbsp; dependency ${t(dep)} · communication ${t(com)}`
          + ` · gap ${t(gap)}`;
      }
      this.showTip(e, html);
    }
  }

  /* Bytes per device over time. data: {K, steps: [{time, bytes}] per device, capacity, label, integer} */
  class MemoryPanel extends Panel {
    constructor(container, data, tooltip) {
      super(container, 150 + AXIS, tooltip);
      this.data = data;
      let top = data.capacity || 0;
      data.steps.forEach((s) => { for (let i = 0; i < s.bytes.length; i++) if (s.bytes[i] > top) top = s.bytes[i]; });
      this.top = top > 0 ? top * 1.08 : 1;
    }
    color(d) { return deviceColor(d, this.data.K); }
    y(v) { return 6 + (1 - v / this.top) * (this.height - AXIS - 12); }
    valueLabel(v) { return this.data.integer ? `${Math.round(v)}` : fmtBytes(v); }
    draw() {
      const g = this.ctx, W = this.width, v = this.view, d0 = this.data;
      g.clearRect(0, 0, W, this.height);
      g.font = "10px sans-serif"; g.fillStyle = "#333"; g.textAlign = "right"; g.strokeStyle = "#e4e4e4";
      for (const f of [0, 0.5, 1]) {
        const y = Math.round(this.y(this.top / 1.08 * f)) + 0.5;
        g.beginPath(); g.moveTo(LEFT, y); g.lineTo(W - RIGHT, y); g.stroke();
        g.fillText(this.valueLabel(this.top / 1.08 * f), LEFT - 4, y + 3);
      }
      g.save(); g.beginPath(); g.rect(LEFT, 0, W - LEFT - RIGHT, this.height); g.clip();
      if (d0.capacity) {
        g.strokeStyle = "#c00"; g.setLineDash([5, 4]);
        const y = Math.round(this.y(d0.capacity)) + 0.5;
        g.beginPath(); g.moveTo(LEFT, y); g.lineTo(W - RIGHT, y); g.stroke(); g.setLineDash([]);
      }
      g.lineWidth = d0.K > 16 ? 1 : 1.6;
      for (let d = 0; d < d0.K; d++) this.drawSteps(d0.steps[d], this.color(d), v.t0, v.t1);
      g.restore();
      g.lineWidth = 1;
      this.axis(this.height - AXIS + 2);
    }
    /* a step function, one pixel column at a time: its minimum to maximum in that column, then the level on */
    drawSteps(s, color, t0, t1) {
      const g = this.ctx, times = s.time, vals = s.bytes, n = times.length;
      if (!n) return;
      let i = Math.max(0, upper(times, t0, 0, n) - 1);
      g.strokeStyle = color; g.beginPath();
      let px = Math.floor(this.x(Math.max(times[i], t0))), level = vals[i], lo = level, hi = level;
      g.moveTo(px, this.y(level));
      for (i = i + 1; i < n && times[i - 1] <= t1; i++) {
        const x = Math.floor(this.x(times[i]));
        if (x === px) { level = vals[i]; lo = Math.min(lo, level); hi = Math.max(hi, level); continue; }
        if (hi !== lo) { g.lineTo(px, this.y(lo)); g.lineTo(px, this.y(hi)); g.lineTo(px, this.y(level)); }
        g.lineTo(x, this.y(level));
        level = vals[i]; lo = hi = level; px = x;
        g.lineTo(x, this.y(level));
      }
      if (hi !== lo) { g.lineTo(px, this.y(lo)); g.lineTo(px, this.y(hi)); g.lineTo(px, this.y(level)); }
      g.lineTo(Math.min(this.width, this.x(Math.min(t1, this.view.tmax))), this.y(level));
      g.stroke();
    }
    hover(e) {
      const t = this.timeAt(e.offsetX), d0 = this.data;
      let best = -1, bestDist = Infinity, bestV = 0;
      for (let d = 0; d < d0.K; d++) {
        const s = d0.steps[d], i = upper(s.time, t, 0, s.time.length) - 1;
        const val = i >= 0 ? s.bytes[i] : 0, dist = Math.abs(this.y(val) - e.offsetY);
        if (dist < bestDist) { bestDist = dist; best = d; bestV = val; }
      }
      if (best < 0) return;
      const unit = timeUnit(this.view.tmax);
      this.showTip(e, `device ${best}: ${this.valueLabel(bestV)} ${d0.integer ? "micro-batches in flight" : "held"}`
        + `<br>at ${fmt(t * unit.scale)} ${unit.name}` + (d0.capacity ? `<br>capacity ${this.valueLabel(d0.capacity)}` : ""));
    }
  }

  /* a legend: the ops present (with chunk tints when devices hold several chunks) */
  function legend(ops, chunks) {
    const box = document.createElement("div");
    box.className = "ps-legend";
    const item = (color, label) => {
      const span = document.createElement("span"), i = document.createElement("i");
      i.style.background = color;
      span.append(i, label);
      box.appendChild(span);
    };
    ops.forEach((op) => item(COLORS[op], `${op} ${NAMES[op]}`));
    for (let c = 1; c < Math.min(chunks || 1, MAX_CHUNKS); c++) item(tint(0, c, chunks), `chunk ${c} (lighter)`);
    item("repeating-linear-gradient(135deg,#fff 0 2px,#c8c8c8 2px 3px)", "idle (bubble)");
    return box;
  }

  function deviceLegend(K) {
    const box = document.createElement("div");
    box.className = "ps-legend";
    if (K > 16) { box.textContent = `${K} devices, one line each: hover a line to name it`; return box; }
    for (let d = 0; d < K; d++) {
      const span = document.createElement("span"), i = document.createElement("i");
      i.style.background = deviceColor(d, K);
      span.append(i, `dev ${d}`);
      box.appendChild(span);
    }
    return box;
  }

  function deviceColor(d, K) { return `hsl(${(d * 137.508) % 360},65%,${K > 8 ? 52 : 42}%)`; }

  PS.timeline = {legend, deviceLegend, deviceColor, View, GanttPanel, MemoryPanel, OPS, COLORS, NAMES, tint, timeUnit, fmt, fmtBytes, niceStep, upper};
})(globalThis.PS = globalThis.PS || {});
