/* A sweep's utilization curves: one chart per schedule, utilization against M (log2 axis), one line per K, the
 * schedule's closed form dashed, every point hoverable with its row of the sweep table. Data from
 * sim/io/pages/sweeps.py. */
(function (PS) {
  "use strict";

  const T = PS.timeline;
  const W = 460, H = 280, L = 50, R = 12, TOP = 12, B = 36;

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) { if (k === "text") e.textContent = v; else e.setAttribute(k, v); }
    (children || []).forEach((c) => e.appendChild(typeof c === "string" ? document.createTextNode(c) : c));
    return e;
  }

  class Chart {
    constructor(box, panel, xs, tooltip) {
      this.panel = panel; this.tooltip = tooltip;
      this.canvas = el("canvas", {class: "ps-canvas"});
      box.appendChild(this.canvas);
      const ratio = window.devicePixelRatio || 1;
      this.canvas.width = W * ratio; this.canvas.height = H * ratio;
      this.canvas.style.width = `${W}px`; this.canvas.style.height = `${H}px`;
      this.ctx = this.canvas.getContext("2d");
      this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      this.lo = Math.log2(Math.min(...xs)); this.hi = Math.log2(Math.max(...xs));
      if (this.hi === this.lo) { this.lo -= 1; this.hi += 1; }
      this.canvas.addEventListener("mousemove", (e) => this.hover(e));
      this.canvas.addEventListener("mouseleave", () => { tooltip.style.display = "none"; });
    }
    x(m) { return L + (Math.log2(m) - this.lo) / (this.hi - this.lo) * (W - L - R); }
    y(u) { return TOP + (1 - u / 1.02) * (H - TOP - B); }
    draw() {
      const g = this.ctx;
      g.clearRect(0, 0, W, H);
      g.strokeStyle = "#e4e4e4"; g.fillStyle = "#333"; g.font = "10px sans-serif"; g.textAlign = "right";
      for (let u = 0; u <= 1.0001; u += 0.25) {
        const y = Math.round(this.y(u)) + 0.5;
        g.beginPath(); g.moveTo(L, y); g.lineTo(W - R, y); g.stroke();
        g.fillText(`${Math.round(u * 100)}%`, L - 4, y + 3);
      }
      g.textAlign = "center";
      for (let p = Math.ceil(this.lo); p <= this.hi; p++) {
        const x = Math.round(this.x(2 ** p)) + 0.5;
        g.beginPath(); g.moveTo(x, TOP); g.lineTo(x, H - B); g.stroke();
        g.fillText(`${2 ** p}`, x, H - B + 14);
      }
      g.fillText("micro-batches M", (L + W - R) / 2, H - 6);
      this.panel.lines.forEach((line, k) => {
        const color = T.deviceColor(k, Math.max(9, this.panel.lines.length));
        g.strokeStyle = color; g.fillStyle = color;
        if (line.closed.length) {
          g.setLineDash([5, 4]); g.globalAlpha = 0.6; g.beginPath();
          line.closed.forEach(([m, u], i) => (i ? g.lineTo(this.x(m), this.y(u)) : g.moveTo(this.x(m), this.y(u))));
          g.stroke(); g.setLineDash([]); g.globalAlpha = 1;
        }
        g.lineWidth = 1.6; g.beginPath();
        line.points.forEach((p, i) => (i ? g.lineTo(this.x(p.M), this.y(p.utilization)) : g.moveTo(this.x(p.M), this.y(p.utilization))));
        g.stroke(); g.lineWidth = 1;
        line.points.forEach((p) => { g.beginPath(); g.arc(this.x(p.M), this.y(p.utilization), 2.6, 0, 2 * Math.PI); g.fill(); });
      });
    }
    hover(e) {
      let best = null, dist = 12;
      this.panel.lines.forEach((line) => line.points.forEach((p) => {
        const d = Math.hypot(this.x(p.M) - e.offsetX, this.y(p.utilization) - e.offsetY);
        if (d < dist) { dist = d; best = {line, p}; }
      }));
      if (!best) { this.tooltip.style.display = "none"; return; }
      const rows = Object.entries(best.p.row).map(([k, v]) => `${k}: ${typeof v === "number" ? T.fmt(v, 5) : v}`);
      this.tooltip.innerHTML = `<b>${this.panel.schedule}, K=${best.line.K}, M=${best.p.M}</b><br>`
        + `utilization ${(100 * best.p.utilization).toFixed(1)}%<br>${rows.join("<br>")}`;
      this.tooltip.style.display = "block";
      this.tooltip.style.left = `${e.pageX + 14}px`; this.tooltip.style.top = `${e.pageY + 14}px`;
    }
  }

  PS.sweep = {
    async start(root, dataId) {
      const doc = await PS.data.load(dataId);
      const tooltip = el("div", {class: "ps-tooltip"});
      document.body.appendChild(tooltip);
      doc.notes.forEach((n) => root.appendChild(el("p", {class: "ps-note", text: n})));
      const grid = el("div", {class: "ps-sweep-grid"});
      root.appendChild(grid);
      const charts = [];
      const xs = doc.panels.flatMap((p) => p.lines.flatMap((l) => l.points.map((q) => q.M)));
      for (const panel of doc.panels) {
        const legend = el("div", {class: "ps-legend"});
        panel.lines.forEach((line, k) => {
          const i = el("i");
          i.style.background = T.deviceColor(k, Math.max(9, panel.lines.length));
          legend.appendChild(el("span", {}, [i, `K=${line.K}`]));
        });
        if (panel.lines.some((l) => l.closed.length)) legend.appendChild(el("span", {text: "dashed: closed form"}));
        const box = el("div", {class: "ps-panel"}, [el("h3", {text: panel.title}), legend]);
        grid.appendChild(box);
        const chart = new Chart(box, panel, xs.length ? xs : [1], tooltip);
        chart.draw();
        charts.push(chart);
      }
      if (doc.failed.length) root.appendChild(el("p", {class: "ps-note", text: `${doc.failed.length} configuration(s) failed: `
        + doc.failed.slice(0, 6).join("; ") + (doc.failed.length > 6 ? "; ..." : "")}));
      return {doc, charts};
    },
  };
})(globalThis.PS = globalThis.PS || {});
