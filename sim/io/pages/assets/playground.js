/* The schedule playground: controls -> the JavaScript list scheduler (engine.js) -> Gantt, memory and figures.
 *
 * Schedules are data: the page holds every generated schedule of its grid (per-device action orders from
 * sim.schedules, written by sim/io/pages/playground.py); only times are computed here. window.pipesim exposes
 * the same computation for tests and for anyone scripting the page:
 *   pipesim.simulate({schedule, K, M, chunks, forward, backward, weight, latency, bandwidth, activation_bytes,
 *                     weight_bytes, memory_capacity}) -> {makespan, bubble_fraction, peak_inflight, ...}
 *   pipesim.command({...})  -> the `pipesim simulate` line that prints the same figures
 */
(function (PS) {
  "use strict";

  const T = PS.timeline;
  const $ = (sel, root) => (root || document).querySelector(sel);

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v; else if (k === "html") e.innerHTML = v; else e.setAttribute(k, v);
    }
    (children || []).forEach((c) => e.appendChild(typeof c === "string" ? document.createTextNode(c) : c));
    return e;
  }

  class Grid {
    constructor(doc) {
      this.doc = doc;
      this.index = new Map();
      doc.entries.forEach((row, i) => this.index.set(`${doc.schedules[row[0]].name}|${row[1]}|${row[2]}|${row[3]}`, i));
      this.byName = new Map(doc.schedules.map((s) => [s.name, s]));
      this.cache = new Map();
    }
    info(name) {
      const s = this.byName.get(name);
      if (!s) throw new Error(`unknown schedule ${JSON.stringify(name)}; choose one of: ${[...this.byName.keys()].join(", ")}`);
      return s;
    }
    chunksFor(name, chunks) {
      const s = this.info(name);
      return chunks === undefined || chunks === null ? s.default_chunks : chunks;
    }
    /* the schedule of (name, K, M, chunks), or an Error saying why there is none */
    get(name, K, M, chunks) {
      chunks = this.chunksFor(name, chunks);
      const key = `${name}|${K}|${M}|${chunks}`;
      if (this.cache.has(key)) return this.cache.get(key);
      const i = this.index.get(key);
      let out;
      if (i === undefined) {
        const why = this.doc.refused[key];
        out = new Error(why ? `pipesim refuses ${name} with K=${K}, M=${M}: ${why}`
          : `${name} with K=${K}, M=${M}, chunks=${chunks} is outside this page's grid (K in ${this.doc.K.join(",")}; `
            + `M in ${this.doc.M[0]}..${this.doc.M[this.doc.M.length - 1]}); pipesim simulate computes it`);
      } else {
        const [, k, m, c, S, keyAt, nKeys, startAt, fusedAt, nFused, placeAt] = this.doc.entries[i];
        const cols = this.doc.columns;
        out = {name, K: k, M: m, chunks: c, S, iterations: 1,
          keys: cols.keys.subarray(keyAt, keyAt + nKeys), start: cols.starts.subarray(startAt, startAt + k + 1),
          fused: Array.from(cols.fused.subarray(fusedAt, fusedAt + nFused)),
          placement: cols.placement.subarray(placeAt, placeAt + S)};
      }
      this.cache.set(key, out);
      return out;
    }
  }

  function normalise(grid, cfg) {
    const c = Object.assign({forward: 1, backward: 2, weight: 0, latency: 0, bandwidth: Infinity, activation_bytes: 0,
      weight_bytes: 0, memory_capacity: null}, cfg);
    for (const k of ["forward", "backward", "weight", "latency", "activation_bytes", "weight_bytes"]) {
      c[k] = Number(c[k]);
      if (!(c[k] >= 0 && Number.isFinite(c[k]))) throw new Error(`${k} must be a finite number >= 0, got ${cfg[k]}`);
    }
    c.bandwidth = c.bandwidth === "inf" || c.bandwidth === null || c.bandwidth === undefined ? Infinity : Number(c.bandwidth);
    if (!(c.bandwidth > 0)) throw new Error(`bandwidth must be > 0 (Infinity: unlimited), got ${cfg.bandwidth}`);
    if (c.memory_capacity !== null && c.memory_capacity !== undefined && c.memory_capacity !== "") {
      c.memory_capacity = Number(c.memory_capacity);
      if (!(c.memory_capacity > 0)) c.memory_capacity = null;
    } else c.memory_capacity = null;
    c.chunks = grid.chunksFor(c.schedule, c.chunks);
    c.K = Number(c.K); c.M = Number(c.M);
    return c;
  }

  /* the schedule's run under cfg: pipesim simulate's numbers and the arrays the drawings read */
  function runConfig(grid, cfg) {
    const c = normalise(grid, cfg);
    const sched = grid.get(c.schedule, c.K, c.M, c.chunks);
    if (sched instanceof Error) throw sched;
    const costs = PS.engine.uniformCosts(sched.S, sched.S / sched.K, c);
    const hw = {latency: c.latency, bandwidth: c.bandwidth, memory_capacity: c.memory_capacity, overlap: true};
    const run = PS.engine.run(sched, costs, hw, {compensatedSum: grid.doc.python.compensated_sum});
    run.config = c; run.schedule = sched;
    return run;
  }

  function num(x) { return String(x); } // JS prints the shortest text that reads back as the same double, as Python does

  function command(grid, cfg) {
    const c = normalise(grid, cfg);
    const parts = ["pipesim", "simulate", "-s", c.schedule, "-K", c.K, "-M", c.M];
    if (grid.info(c.schedule).variable_chunks) parts.push("--chunks", c.chunks);
    parts.push("--forward", num(c.forward), "--backward", num(c.backward));
    if (c.weight) parts.push("--weight", num(c.weight));
    if (c.latency) parts.push("--latency", num(c.latency));
    if (c.bandwidth !== Infinity) parts.push("--bandwidth", num(c.bandwidth));
    if (c.activation_bytes) parts.push("--activation-bytes", num(c.activation_bytes));
    if (c.weight_bytes) parts.push("--weight-bytes", num(c.weight_bytes));
    if (c.memory_capacity) parts.push("--memory-capacity", num(c.memory_capacity));
    return parts.join(" ");
  }

  /* the panel data of a run, in the layout timeline.js draws */
  function ganttData(run) {
    const f = run.flat, t = run.times, n = f.n;
    const chunkOf = new Int8Array(f.S), seen = new Map();
    for (let s = 0; s < f.S; s++) { const d = f.placement[s]; chunkOf[s] = seen.get(d) || 0; seen.set(d, chunkOf[s] + 1); }
    const chunk = new Int8Array(n);
    for (let i = 0; i < n; i++) chunk[i] = chunkOf[f.stage[i]];
    // transfers, by sender then start
    const sent = [];
    for (let i = 0; i < n; i++) if (run.plan.link[i] >= 0 && t.sentEnd[i] > t.sentStart[i]) sent.push(i);
    sent.sort((a, b) => f.device[a] - f.device[b] || t.sentStart[a] - t.sentStart[b]);
    const srcStart = new Int32Array(f.K + 1);
    sent.forEach((i) => srcStart[f.device[i] + 1]++);
    for (let d = 0; d < f.K; d++) srcStart[d + 1] += srcStart[d];
    const pick = (arr, Type) => Type.from(sent, (i) => arr[i]);
    const xfer = sent.length ? {srcStart, start: pick(t.sentStart, Float64Array), end: pick(t.sentEnd, Float64Array),
      op: Int8Array.from(sent, (i) => (f.kind[i] === PS.engine.OP_F ? 5 : 6)), stage: pick(f.stage, Int32Array),
      mb: pick(f.mb, Int32Array), dst: pick(f.sendTo, Int32Array), bytes: pick(run.plan.nbytes, Float64Array)} : null;
    return {K: f.K, chunks: f.S / f.K, makespan: run.makespan, xfer,
      comp: Object.assign({devStart: f.start, start: t.start, end: t.end, op: f.kind, stage: f.stage, mb: f.mb, chunk},
        waits(run))};
  }

  /* What each action waited for, by the rules of sim/io/pages/waits.py (validate/compare/idle.py's categories):
   * until its inputs were computed (dependency), then until they had arrived (communication). A simulation
   * with overlapping transfers has no gap. */
  function waits(run) {
    const f = run.flat, t = run.times, n = f.n;
    const dependency = new Float64Array(n), communication = new Float64Array(n), gap = new Float64Array(n);
    for (let d = 0; d < f.K; d++) {
      let free = 0.0;
      for (let i = f.start[d]; i < f.start[d + 1]; i++) {
        const start = t.start[i];
        if (start > free) {
          let computed = free, arrived = free;
          for (let j = f.depStart[i]; j < f.depStart[i + 1]; j++) {
            const slot = f.depSlot[j], p = slot >= n ? slot - n : slot;
            computed = Math.max(computed, t.end[p]);
            arrived = Math.max(arrived, slot >= n ? t.sentEnd[p] : t.end[p]);
          }
          computed = Math.min(computed, start);
          arrived = Math.min(Math.max(arrived, computed), start);
          dependency[i] = computed - free; communication[i] = arrived - computed; gap[i] = start - arrived;
        }
        free = Math.max(free, t.end[i]);
      }
    }
    return {wait_dependency: dependency, wait_communication: communication, wait_gap: gap};
  }

  function memoryData(run) {
    const anyBytes = run.memory.peak.some((b) => b > 0);
    if (anyBytes) return {K: run.flat.K, steps: run.memory.steps, capacity: run.config.memory_capacity, integer: false};
    // no byte sizes given: micro-batches in flight instead (as the PNG's memory panel does)
    const c = Object.assign({}, run.config, {activation_bytes: 1, weight_bytes: 0});
    const costs = PS.engine.uniformCosts(run.flat.S, 1, c);
    const mem = PS.engine.memory(run.flat, costs, run.times, null);
    return {K: run.flat.K, steps: mem.steps, capacity: null, integer: true};
  }

  const pct = (x) => (Number.isFinite(x) ? `${(100 * x).toFixed(1)}%` : "–");

  function figures(grid, run) {
    const c = run.config, K = c.K, maxPeak = Math.max(...run.peak_memory);
    const cf = PS.closedForm(c.schedule, K, c.M, c.chunks, c.forward, c.backward, c.weight);
    const free = c.latency === 0 && (c.bandwidth === Infinity || c.activation_bytes === 0);
    let closed = "none for this schedule: simulate it";
    if (cf.text) {
      closed = Number.isFinite(cf.value)
        ? `${pct(cf.value)} = ${cf.text}` + (free ? "" : " (assumes free links)")
        : `${cf.text}: its conditions do not hold here`;
    }
    const rows = [
      ["makespan", `${T.fmt(run.makespan)} s`],
      ["utilization", pct(run.utilization)],
      ["bubble fraction", pct(run.bubble_fraction)],
      ["bubble ratio (idle / busy)", T.fmt(run.bubble_ratio, 4)],
      ["closed-form utilization", closed],
      ["peak memory (worst device)", maxPeak > 0 ? T.fmtBytes(maxPeak) : "0 (give bytes per micro-batch)"],
      ["peak in flight per device", run.peak_inflight.join(" ")],
    ];
    if (run.memory.overflow.length) {
      rows.push(["memory cap", run.memory.overflow.map((o) => `device ${o.device} over by ${T.fmtBytes(o.excess_bytes)}`).join("; ")]);
    }
    return rows;
  }

  class Playground {
    constructor(root, doc) {
      this.root = root; this.doc = doc; this.grid = new Grid(doc);
      this.view = new T.View();
      this.tooltip = el("div", {class: "ps-tooltip"});
      document.body.appendChild(this.tooltip);
      this.build();
      this.redraw();
      let pending = null;
      window.addEventListener("resize", () => {
        clearTimeout(pending);
        pending = setTimeout(() => { this.view.panels.forEach((p) => p.resize()); this.view.draw(); }, 100);
      });
    }
    control(label, input, hint) {
      return el("label", {class: "ps-control"}, [el("span", {text: label}), input].concat(hint ? [el("small", {text: hint})] : []));
    }
    build() {
      const d = this.doc.defaults, names = this.doc.schedules.map((s) => s.name);
      const select = (id, values, value, labels) => {
        const s = el("select", {id});
        values.forEach((v, i) => s.appendChild(el("option", {value: v, text: labels ? labels[i] : v})));
        s.value = value;
        return s;
      };
      const number = (id, value, step, min) => el("input", {id, type: "number", value, step, min: min === undefined ? 0 : min});
      this.inputs = {
        schedule: select("ps-schedule", names, d.schedule),
        compare: select("ps-compare", [""].concat(names), d.compare, ["none"].concat(names)),
        K: select("ps-K", this.doc.K, d.K),
        M: el("input", {id: "ps-M", type: "range", min: 0, max: this.doc.M.length - 1, step: 1,
          value: Math.max(0, this.doc.M.indexOf(d.M))}),
        chunks: select("ps-chunks", [1], 1),
        forward: number("ps-forward", d.forward, 0.1),
        backward: number("ps-backward", d.backward, 0.1),
        weight: number("ps-weight", d.weight, 0.1),
        latency: number("ps-latency", d.latency, 0.05),
        bandwidth: number("ps-bandwidth", "", 1e6, 1),
        activation_bytes: number("ps-activation", d.activation_bytes, 1e6),
        weight_bytes: number("ps-weight-bytes", d.weight_bytes, 1e6),
        memory_capacity: number("ps-capacity", "", 1e6),
      };
      this.inputs.bandwidth.placeholder = "inf";
      this.inputs.memory_capacity.placeholder = "none";
      this.mLabel = el("b", {id: "ps-M-value"});
      const i = this.inputs;
      const controls = el("div", {class: "ps-controls"}, [
        this.control("schedule", i.schedule), this.control("compare with", i.compare),
        this.control("devices K", i.K), el("label", {class: "ps-control"}, [el("span", {}, ["micro-batches M = ", this.mLabel]), i.M]),
        this.control("chunks per device", i.chunks),
        this.control("forward F (s)", i.forward), this.control("backward B (s)", i.backward),
        this.control("weight grad W (s)", i.weight, "0: B and W run as one"),
        this.control("link latency (s)", i.latency), this.control("bandwidth (B/s)", i.bandwidth, "empty: unlimited"),
        this.control("bytes per micro-batch", i.activation_bytes, "sent between stages and kept until B"),
        this.control("weight bytes per device", i.weight_bytes),
        this.control("memory cap (B)", i.memory_capacity, "empty: none"),
      ]);
      this.status = el("div", {class: "ps-status", id: "ps-status"});
      this.commands = el("div", {class: "ps-commands"});
      this.tables = el("div", {class: "ps-figures", id: "ps-figures"});
      this.charts = el("div", {class: "ps-charts", id: "ps-charts"});
      this.info = el("div", {class: "ps-info"});
      this.root.append(controls, this.status, this.tables, this.commands, this.charts, this.info);
      Object.values(i).forEach((input) => input.addEventListener("input", () => this.redraw()));
      i.schedule.addEventListener("change", () => this.redraw());
    }
    config(which) {
      const i = this.inputs, name = which === "compare" ? i.compare.value : i.schedule.value;
      const info = this.grid.info(name);
      const chosen = Number(i.chunks.value); // the chunks control follows the first schedule; the other may not take it
      const chunks = info.variable_chunks && info.chunks.includes(chosen) ? chosen : info.default_chunks;
      return {schedule: name, K: Number(i.K.value), M: this.doc.M[Number(i.M.value)], chunks,
        forward: Number(i.forward.value) || 0, backward: Number(i.backward.value) || 0, weight: Number(i.weight.value) || 0,
        latency: Number(i.latency.value) || 0,
        bandwidth: i.bandwidth.value === "" ? Infinity : Number(i.bandwidth.value),
        activation_bytes: Number(i.activation_bytes.value) || 0, weight_bytes: Number(i.weight_bytes.value) || 0,
        memory_capacity: i.memory_capacity.value === "" ? null : Number(i.memory_capacity.value)};
    }
    syncChunks() {
      const info = this.grid.info(this.inputs.schedule.value), s = this.inputs.chunks, old = Number(s.value);
      const options = info.chunks;
      s.innerHTML = "";
      options.forEach((c) => s.appendChild(el("option", {value: c, text: c})));
      s.value = options.includes(old) ? old : info.default_chunks;
      s.disabled = options.length < 2;
    }
    redraw() {
      const t0 = performance.now();
      this.syncChunks();
      this.mLabel.textContent = this.doc.M[Number(this.inputs.M.value)];
      const runs = [], errors = [];
      const which = this.inputs.compare.value ? ["schedule", "compare"] : ["schedule"];
      for (const w of which) {
        const cfg = this.config(w);
        try { runs.push(runConfig(this.grid, cfg)); } catch (e) { errors.push(e.message); }
      }
      this.tables.innerHTML = "";
      this.commands.innerHTML = "";
      if (runs.length) {
        const table = el("table", {class: "ps-table"});
        table.appendChild(el("tr", {}, [el("th", {text: ""})].concat(runs.map((r) => el("th", {text: r.config.schedule})))));
        const rowsPer = runs.map((r) => figures(this.grid, r));
        rowsPer[0].forEach((row, k) => table.appendChild(el("tr", {}, [el("td", {text: row[0]})].concat(
          rowsPer.map((rows) => el("td", {text: rows[k] ? rows[k][1] : ""}))))));
        const extra = rowsPer.slice(1).map((rows) => rows.slice(rowsPer[0].length)).flat();
        extra.forEach((row) => table.appendChild(el("tr", {}, [el("td", {text: row[0]}), el("td", {text: ""}), el("td", {text: row[1]})])));
        this.tables.appendChild(table);
        runs.forEach((r) => {
          const line = command(this.grid, r.config);
          const button = el("button", {type: "button", class: "ps-copy", text: "copy command"});
          button.addEventListener("click", () => this.copy(line, button));
          this.commands.appendChild(el("div", {class: "ps-command"}, [button, el("code", {text: line})]));
        });
      }
      this.view.clear();
      this.charts.innerHTML = "";
      this.view.fit(Math.max(1e-300, ...runs.map((r) => r.makespan)));
      const gantts = runs.map((r) => ganttData(r));
      if (runs.length) { // the legend: the ops drawn (transfers only where one takes time)
        const ops = new Set(["F", "B"]);
        let chunks = 1;
        runs.forEach((r, k) => {
          for (let i = 0; i < r.flat.n; i++) ops.add(PS.engine.KINDS[r.flat.kind[i]]);
          if (gantts[k].xfer) for (let i = 0; i < gantts[k].xfer.op.length; i++) ops.add(T.OPS[gantts[k].xfer.op[i]]);
          chunks = Math.max(chunks, r.flat.S / r.flat.K);
        });
        this.charts.appendChild(T.legend(T.OPS.filter((op) => ops.has(op)), chunks));
      }
      for (const [k, r] of runs.entries()) {
        const title = `${r.config.schedule}: K=${r.config.K}, M=${r.config.M}` + (r.flat.S > r.flat.K ? `, ${r.flat.S / r.flat.K} chunks per device` : "")
          + ` — utilization ${pct(r.utilization)}`;
        const box = el("div", {class: "ps-panel"}, [el("h3", {text: title})]);
        this.charts.appendChild(box);
        this.view.add(new T.GanttPanel(box, gantts[k], this.tooltip));
      }
      for (const r of runs) {
        const mem = memoryData(r);
        const box = el("div", {class: "ps-panel"}, [el("h3", {text: `${r.config.schedule}: ${mem.integer
          ? "micro-batches in flight per device (no byte sizes given)" : "memory held per device"}`}),
          T.deviceLegend(r.flat.K)]);
        this.charts.appendChild(box);
        this.view.add(new T.MemoryPanel(box, mem, this.tooltip));
      }
      this.view.draw();
      const s = this.grid.info(this.inputs.schedule.value);
      this.info.innerHTML = "";
      this.info.append(el("p", {}, [el("b", {text: s.name}), ` — ${s.summary}`]),
        el("p", {text: `source: ${s.source}`}), el("p", {text: `bubble: ${s.bubble}`}), el("p", {text: `memory: ${s.memory}`}));
      this.lastRedrawMs = performance.now() - t0;
      this.status.textContent = errors.join(" · ") || `redrawn in ${this.lastRedrawMs.toFixed(1)} ms · drag to pan, `
        + "wheel to zoom, double-click to reset, hover a box for its times and what it waited for";
      this.status.classList.toggle("ps-error", errors.length > 0);
    }
    copy(text, button) {
      const done = () => { button.textContent = "copied"; setTimeout(() => { button.textContent = "copy command"; }, 1200); };
      if (navigator.clipboard && window.isSecureContext) navigator.clipboard.writeText(text).then(done, () => this.fallbackCopy(text, done));
      else this.fallbackCopy(text, done);
    }
    fallbackCopy(text, done) { // file:// pages are no secure context: select a hidden textarea and copy
      const area = el("textarea", {class: "ps-offscreen"});
      area.value = text;
      document.body.appendChild(area);
      area.select();
      try { document.execCommand("copy"); } finally { area.remove(); }
      this.lastCopied = text;
      done();
    }
  }

  PS.playground = {
    async start(root, dataId) {
      const doc = await PS.data.load(dataId);
      const page = new Playground(root, doc);
      const grid = page.grid;
      const api = {
        loaded: true, page, doc,
        simulate(cfg) {
          const r = runConfig(grid, cfg);
          return {makespan: r.makespan, bubble_fraction: r.bubble_fraction, peak_inflight: r.peak_inflight,
            utilization: r.utilization, bubble_ratio: r.bubble_ratio, bubble_rate_zb: r.bubble_rate_zb,
            peak_memory: r.peak_memory, weight_versions: r.weight_versions,
            memory_overflow: r.memory.overflow.map((o) => o.device)};
        },
        command: (cfg) => command(grid, cfg),
        /* the drawn data of a run: per action (device by device, in run order) start, end and its wait split */
        timeline: (cfg) => {
          const c = ganttData(runConfig(grid, cfg)).comp, plain = (a) => Array.from(a);
          return {devStart: plain(c.devStart), start: plain(c.start), end: plain(c.end), dependency: plain(c.wait_dependency),
            communication: plain(c.wait_communication), gap: plain(c.wait_gap)};
        },
        closedForm: (cfg) => { const c = normalise(grid, cfg); return PS.closedForm(c.schedule, c.K, c.M, c.chunks, c.forward, c.backward, c.weight).value; },
        configs: () => doc.entries.map((row) => ({schedule: doc.schedules[row[0]].name, K: row[1], M: row[2], chunks: row[3]})),
        get lastRedrawMs() { return page.lastRedrawMs; },
        redraw: () => { page.redraw(); return page.lastRedrawMs; },
      };
      return api;
    },
  };
})(globalThis.PS = globalThis.PS || {});
