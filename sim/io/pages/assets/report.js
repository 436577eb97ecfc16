/* An interactive timeline report: one or more runs (predicted and measured, or several schedules) stacked on
 * one time axis, each with its Gantt and memory panel; zoom and pan move every panel together. The data come
 * from sim/io/pages/timelines.py. window.pipesim exposes the view for tests: zoom(t0, t1), lastDrawMs. */
(function (PS) {
  "use strict";

  const T = PS.timeline;

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v; else e.setAttribute(k, v);
    }
    (children || []).forEach((c) => e.appendChild(typeof c === "string" ? document.createTextNode(c) : c));
    return e;
  }

  function table(header, rows) {
    const t = el("table", {class: "ps-table"});
    if (header) t.appendChild(el("tr", {}, header.map((h) => el("th", {text: h}))));
    rows.forEach((r) => t.appendChild(el("tr", {}, r.map((c) => el("td", {text: c})))));
    return t;
  }

  function build(root, doc) {
    const view = new T.View(), tooltip = el("div", {class: "ps-tooltip"});
    document.body.appendChild(tooltip);
    doc.notes.forEach((n) => root.appendChild(el("p", {class: "ps-note", text: n})));
    if (doc.summary.length) root.appendChild(table(null, doc.summary));
    // the runs' figures side by side
    const labels = doc.runs[0].figures.map((r) => r[0]);
    const rows = labels.map((label) => [label].concat(doc.runs.map((run) => {
      const hit = run.figures.find((r) => r[0] === label);
      return hit ? hit[1] : "";
    })));
    root.appendChild(table([""].concat(doc.runs.map((r) => r.title)), rows));
    const toolbar = el("div", {class: "ps-toolbar"});
    const button = (text, f) => { const b = el("button", {type: "button", text}); b.addEventListener("click", f); toolbar.appendChild(b); };
    button("zoom in", () => view.zoom(0.5, (view.t0 + view.t1) / 2));
    button("zoom out", () => view.zoom(2, (view.t0 + view.t1) / 2));
    button("reset", () => view.set(0, view.tmax));
    const status = el("span", {class: "ps-status"});
    toolbar.appendChild(status);
    root.appendChild(toolbar);
    const ops = new Set(), chunks = Math.max(...doc.runs.map((r) => r.chunks));
    doc.runs.forEach((r) => r.ops.forEach((o) => ops.add(o)));
    root.appendChild(T.legend(T.OPS.filter((o) => ops.has(o)), chunks));
    view.fit(Math.max(...doc.runs.map((r) => r.makespan)));
    for (const run of doc.runs) {
      const box = el("div", {class: "ps-panel"}, [el("h3", {text: run.title})]);
      root.appendChild(box);
      view.add(new T.GanttPanel(box, run, tooltip));
    }
    for (const run of doc.runs) {
      const mem = run.memory, box = el("div", {class: "ps-panel"}, [el("h3", {text: `${run.title}: ${mem.integer
        ? "micro-batches in flight per device (no byte sizes)" : "memory held per device"}`}), T.deviceLegend(mem.K)]);
      root.appendChild(box);
      view.add(new T.MemoryPanel(box, mem, tooltip));
    }
    const unit = () => T.timeUnit(view.tmax);
    view.listeners.push((v) => {
      const u = unit();
      status.textContent = `showing ${T.fmt(v.t0 * u.scale, 4)} – ${T.fmt(v.t1 * u.scale, 4)} ${u.name} · drawn in `
        + `${v.lastDrawMs.toFixed(1)} ms · drag to pan, wheel to zoom, double-click to reset, hover a box`;
    });
    view.draw();
    let pending = null;
    window.addEventListener("resize", () => {
      clearTimeout(pending);
      pending = setTimeout(() => { view.panels.forEach((p) => p.resize()); view.draw(); }, 100);
    });
    return view;
  }

  PS.report = {
    async start(root, dataId) {
      const doc = await PS.data.load(dataId);
      const view = build(root, doc);
      return {
        doc, view,
        zoom: (t0, t1) => { view.set(t0, t1); return view.lastDrawMs; },
        get lastDrawMs() { return view.lastDrawMs; },
      };
    },
  };
})(globalThis.PS = globalThis.PS || {});
