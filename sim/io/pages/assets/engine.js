/* pipesim's exact list scheduler, its plan, metrics and memory model, ported to JavaScript.
 *
 * The page computes times in the browser so that the controls redraw at once; every number must equal what
 * `pipesim simulate` prints for the same settings, so each step below is the Python code's, operation by
 * operation (IEEE doubles in both languages give the same floats when the same operations run in the same
 * order). Sources, all under sim/ in the pipesim repository:
 *   - the key codec: key = (mb * S + stage) * 5 + kind (sim/core/keys.py);
 *   - dependencies: sim/core/compiled.py, _flat_kernel (F(s,m) after F(s-1,m); B(s,m) after B(s+1,m), the last
 *     stage after its own F, and after R(s,m); W after B; R after F; U after every B/W of its group), and
 *     _merge_inputs (an overlapped pair waits for the inputs of both halves);
 *   - durations and transfers: sim/engines/plan.py (_plan_numpy, _transfer_seconds);
 *   - the walk: sim/engines/fastpath.py, _list_schedule;
 *   - metrics: sim/results/metrics.py; memory: sim/results/memory.py (_numpy_profile, _weight_version_events);
 *   - uniform costs as the CLI builds them: sim/cli/options.py (costs_from_args) and
 *     sim/model/cost.py (uniform, StageCosts.split_into_chunks).
 * tests/test_pages_browser.py holds this file to `pipesim simulate` on hundreds of random configurations.
 */
(function (PS) {
  "use strict";

  const NUM_KINDS = 5, OP_F = 0, OP_B = 1, OP_W = 2, OP_R = 3, OP_U = 4;
  const KINDS = ["F", "B", "W", "R", "U"];

  /* Python's sum() of floats: plain left-to-right addition up to 3.11; from 3.12 on, Neumaier's compensated
   * sum (CPython's Python/bltinmodule.c, builtin_sum_impl). The page says which Python wrote it. */
  function pySum(values, compensated) {
    if (!values.length) return 0;
    let total = 0 + values[0];
    if (!compensated) {
      for (let i = 1; i < values.length; i++) total += values[i];
      return total;
    }
    let c = 0.0;
    for (let i = 1; i < values.length; i++) {
      const x = values[i], t = total + x;
      if (Math.abs(total) >= Math.abs(x)) c += (total - t) + x; else c += (x - t) + total;
      total = t;
    }
    if (c && Number.isFinite(c)) total += c;
    return total;
  }

  /* A schedule as the engines read it: {K, S, M, iterations, placement[S], keys[n] (device by device),
   * start[K+1] (device d runs keys[start[d] .. start[d+1]-1]), fused[] (positions i whose action runs
   * overlapped with action i+1)}. Returns the codec's parts and every action's inputs as CSR arrays whose
   * slots follow sim/core/compiled.py: slot i is the end of action i, slot n + i the arrival of its result. */
  function flatten(sched) {
    const keys = sched.keys, n = keys.length, S = sched.S, K = sched.K, placement = sched.placement;
    let top = -1;
    for (let i = 0; i < n; i++) if (keys[i] > top) top = keys[i];
    const size = top + NUM_KINDS + 1;
    const index = new Int32Array(size).fill(-1); // key -> position
    const device = new Int32Array(n), kind = new Int8Array(n), stage = new Int32Array(n), mb = new Int32Array(n);
    let updatesStage0 = 0, nUpdates = 0;
    for (let d = 0; d < K; d++) {
      for (let i = sched.start[d]; i < sched.start[d + 1]; i++) {
        const key = keys[i], pair = Math.floor(key / NUM_KINDS);
        device[i] = d; kind[i] = key - pair * NUM_KINDS; stage[i] = pair % S; mb[i] = Math.floor(pair / S);
        index[key] = i;
        if (kind[i] === OP_U) { nUpdates++; if (stage[i] === 0) updatesStage0++; }
      }
    }
    const total = sched.M * sched.iterations;
    const g = updatesStage0 ? Math.floor(total / updatesStage0) : total; // micro-batches per update
    const present = (k) => k < size && index[k] >= 0;
    let depStart = new Int32Array(n + 1), depSlot = new Int32Array(2 * n + nUpdates * g);
    const sendTo = new Int32Array(n).fill(-1);
    let at = 0;
    for (let i = 0; i < n; i++) {
      const k = kind[i], base = keys[i] - k;
      if (k === OP_F) {
        if (stage[i] > 0) depSlot[at++] = base - NUM_KINDS; // F(s-1, m)
      } else if (k === OP_B) {
        depSlot[at++] = stage[i] < S - 1 ? base + NUM_KINDS + OP_B : base + OP_F; // B(s+1, m); last stage: F(s, m)
        if (present(base + OP_R)) depSlot[at++] = base + OP_R;
      } else if (k === OP_W) {
        depSlot[at++] = base + OP_B;
      } else if (k === OP_R) {
        depSlot[at++] = base + OP_F;
      } else { // U(s, u) waits for micro-batches u*g .. (u+1)*g-1 of its stage
        const u = mb[i];
        for (let j = 0; j < g; j++) {
          const grad = ((u * g + j) * S + stage[i]) * NUM_KINDS;
          depSlot[at++] = present(grad + OP_W) ? grad + OP_W : grad + OP_B;
        }
      }
      for (let j = depStart[i]; j < at; j++) { // keys -> slots: own device's end, or an arrival
        let p = index[depSlot[j]];
        if (device[p] !== device[i]) { sendTo[p] = device[i]; p += n; }
        depSlot[j] = p;
      }
      depStart[i + 1] = at;
    }
    depSlot = depSlot.slice(0, at);
    const fused = sched.fused || [];
    if (fused.length) { // _merge_inputs: action i's range extends to the end of action i+1's
      const ends = depStart.slice(1);
      for (const i of fused) ends[i] = depStart[i + 2];
      const newStart = new Int32Array(n + 1), slots = [];
      for (let i = 0; i < n; i++) {
        for (let j = depStart[i]; j < ends[i]; j++) slots.push(depSlot[j]);
        newStart[i + 1] = slots.length;
      }
      depStart = newStart; depSlot = Int32Array.from(slots);
    }
    return {n, K, S, keys, device, kind, stage, mb, placement, start: sched.start, depStart, depSlot, sendTo,
            fused, present, g, M: sched.M, iterations: sched.iterations};
  }

  /* Per-stage costs as `pipesim simulate` builds them from --forward/--backward/--weight/--activation-bytes/
   * --weight-bytes: uniform over the devices' stages, then each stage cut into `chunks` pieces (times and kept
   * bytes divided, sent bytes repeated). */
  function uniformCosts(S, chunks, c) {
    const per = (v) => (chunks > 1 ? v / chunks : v);
    const fill = (v) => new Float64Array(S).fill(v);
    return {
      forward: fill(per(c.forward)), backward: fill(per(c.backward)), weight: fill(per(c.weight || 0)),
      recompute: fill(per(c.forward)), update: fill(per(c.update || 0)),
      send_bytes: fill(c.activation_bytes || 0), activation_bytes: fill(per(c.activation_bytes || 0)),
      checkpoint_bytes: fill(c.activation_bytes || 0),
      weight_bytes: fill(per(c.weight_bytes || 0)), grad_bytes: fill(per(c.weight_bytes || 0)),
      optimizer_bytes: fill(0),
    };
  }

  /* Durations and transfers (sim/engines/plan.py): B is the whole backward (B + W) unless its W exists;
   * a transfer holds its directed link latency + bytes / bandwidth (bytes 0: latency alone). */
  function plan(flat, costs, hw) {
    const n = flat.n, K = flat.K, duration = new Float64Array(n), seconds = new Float64Array(n),
      nbytes = new Float64Array(n), link = new Int32Array(n).fill(-1);
    const codes = new Map();
    for (let i = 0; i < n; i++) {
      const k = flat.kind[i], s = flat.stage[i];
      if (k === OP_F) duration[i] = costs.forward[s];
      else if (k === OP_B) duration[i] = flat.present(flat.keys[i] + (OP_W - OP_B)) ? costs.backward[s]
        : costs.backward[s] + costs.weight[s];
      else if (k === OP_W) duration[i] = costs.weight[s];
      else if (k === OP_R) duration[i] = costs.recompute[s];
      else duration[i] = costs.update[s];
      const to = flat.sendTo[i];
      if (to >= 0) {
        const b = costs.send_bytes[k === OP_F ? s : s - 1];
        const code = flat.device[i] * K + to;
        if (!codes.has(code)) codes.set(code, codes.size);
        link[i] = codes.get(code);
        nbytes[i] = b;
        seconds[i] = hw.latency + (b > 0 ? b / hw.bandwidth : 0.0);
      }
    }
    const saved = hw.overlap_saved || 0.0; // OverlapFB(): a pair lasts (F + B) x (1 - saved)
    for (const i of flat.fused) {
      duration[i] = (duration[i] + duration[i + 1]) * (1.0 - saved);
      duration[i + 1] = 0.0;
    }
    return {duration, seconds, nbytes, link, links: codes.size};
  }

  /* sim/engines/fastpath.py, _list_schedule: walk each device as far as its inputs allow, park a blocked device
   * on the missing input, resume it when that input is produced. -1 marks a time not known yet. */
  function listSchedule(flat, p, overlap) {
    const n = flat.n, K = flat.K, devStart = flat.start, depStart = flat.depStart, depSlot = flat.depSlot;
    const ready = new Float64Array(2 * n).fill(-1), head = new Int32Array(2 * n).fill(-1);
    const nextWaiting = new Int32Array(K).fill(-1);
    const startOut = new Float64Array(n), endOut = new Float64Array(n);
    const sentStart = new Float64Array(n), sentEnd = new Float64Array(n);
    const linkFree = new Float64Array(p.links), deviceFree = new Float64Array(K);
    const position = Int32Array.from(devStart.slice(0, K));
    const todo = new Int32Array(Math.max(K, 1) + K);
    for (let d = 0; d < K; d++) todo[d] = K - 1 - d;
    let count = K;
    const wake = (slot) => {
      let w = head[slot];
      head[slot] = -1;
      while (w >= 0) { todo[count++] = w; w = nextWaiting[w]; }
    };
    while (count > 0) {
      const d = todo[--count];
      let i = position[d];
      const last = devStart[d + 1];
      let tFree = deviceFree[d];
      while (i < last) {
        let start = tFree, blocked = -1;
        for (let j = depStart[i]; j < depStart[i + 1]; j++) {
          const slot = depSlot[j], t = ready[slot];
          if (t < 0.0) { blocked = slot; break; }
          if (t > start) start = t;
        }
        if (blocked >= 0) { nextWaiting[d] = head[blocked]; head[blocked] = d; break; }
        const end = start + p.duration[i];
        startOut[i] = start; endOut[i] = end; ready[i] = end; tFree = end;
        wake(i);
        const lk = p.link[i];
        if (lk >= 0) {
          let t0 = linkFree[lk];
          if (end > t0) t0 = end;
          const t1 = t0 + p.seconds[i];
          linkFree[lk] = t1; sentStart[i] = t0; sentEnd[i] = t1; ready[n + i] = t1;
          if (!overlap) tFree = t1; // a blocking send keeps the sender busy until the data has left
          wake(n + i);
        }
        i++;
      }
      position[d] = i;
      deviceFree[d] = tFree;
    }
    for (let d = 0; d < K; d++) {
      if (position[d] < devStart[d + 1]) throw new Error(`the schedule deadlocks: device ${d} is stuck at step `
        + `${position[d] - devStart[d]}`);
    }
    return {start: startOut, end: endOut, sentStart, sentEnd};
  }

  /* sim/results/memory.py, _weight_version_events: +1 version when a U ends, -1 when the old version is neither
   * current nor read by a micro-batch still waiting for its backward. Returns events [device, time, delta, stage]. */
  function versionEvents(flat, run) {
    const out = [];
    let anyU = false;
    for (let i = 0; i < flat.n; i++) if (flat.kind[i] === OP_U) { anyU = true; break; }
    if (!anyU) return out;
    for (let s = 0; s < flat.S; s++) {
      const created = [], fRows = [], bRows = [];
      let top = 0;
      for (let i = 0; i < flat.n; i++) {
        if (flat.stage[i] !== s) continue;
        if (flat.mb[i] > top) top = flat.mb[i];
        const k = flat.kind[i];
        if (k === OP_U) created.push(run.end[i]);
        else if (k === OP_F) fRows.push(i);
        if (k === OP_W || (k === OP_B && !flat.present(flat.keys[i] + (OP_W - OP_B)))) bRows.push(i);
      }
      created.sort((a, b) => a - b);
      const backwardEnd = new Float64Array(top + 1);
      for (const i of bRows) backwardEnd[flat.mb[i]] = run.end[i];
      const release = created.concat([Infinity]);
      for (const i of fRows) {
        let lo = 0, hi = created.length; // searchsorted(created, start, side="right")
        while (lo < hi) { const mid = (lo + hi) >> 1; if (created[mid] <= run.start[i]) lo = mid + 1; else hi = mid; }
        const e = backwardEnd[flat.mb[i]];
        if (e > release[lo]) release[lo] = e;
      }
      const dev = flat.placement[s];
      for (const t of created) out.push([dev, t, 1.0, s]);
      for (let v = 0; v < created.length; v++) out.push([dev, release[v], -1.0, s]);
    }
    return out;
  }

  /* sim/results/memory.py, _numpy_profile: events sorted (stably) by device, time, frees before allocations;
   * bytes held = static + the running sum of the deltas. Returns peaks and every device's step function. */
  function memory(flat, costs, run, capacity) {
    const K = flat.K, S = flat.S, n = flat.n;
    const staticBytes = new Float64Array(K), stagesOn = new Float64Array(K);
    for (let s = 0; s < S; s++) {
      const d = flat.placement[s];
      staticBytes[d] += (costs.weight_bytes[s] + costs.grad_bytes[s]) + costs.optimizer_bytes[s];
      stagesOn[d] += 1;
    }
    const pair = (i) => flat.mb[i] * S + flat.stage[i];
    const hasW = new Set(), hasR = new Set();
    for (let i = 0; i < n; i++) {
      if (flat.kind[i] === OP_W) hasW.add(pair(i));
      else if (flat.kind[i] === OP_R) hasR.add(pair(i));
    }
    const act = costs.activation_bytes, ckpt = costs.checkpoint_bytes;
    const ev = []; // [device, time, bytes, inflight, versions]
    for (let i = 0; i < n; i++) if (flat.kind[i] === OP_F) {
      const s = flat.stage[i];
      ev.push([flat.device[i], run.start[i], hasR.has(pair(i)) ? ckpt[s] : act[s], 1.0, 0.0]);
    }
    for (let i = 0; i < n; i++) if (flat.kind[i] === OP_R) ev.push([flat.device[i], run.start[i], act[flat.stage[i]], 0.0, 0.0]);
    for (let i = 0; i < n; i++) {
      const k = flat.kind[i];
      if (k === OP_W || (k === OP_B && !hasW.has(pair(i)))) {
        const s = flat.stage[i];
        ev.push([flat.device[i], run.end[i], -(hasR.has(pair(i)) ? ckpt[s] + act[s] : act[s]), -1.0, 0.0]);
      }
    }
    for (const [d, t, delta, s] of versionEvents(flat, run)) ev.push([d, t, delta * costs.weight_bytes[s], 0.0, delta]);
    const order = ev.map((e, i) => i);
    const freesFirst = (e) => (e[2] < 0 || e[3] < 0 || e[4] < 0 ? 0 : 1);
    order.sort((a, b) => { // Array.prototype.sort is stable (ES2019): numpy's lexsort keeps ties in order too
      const x = ev[a], y = ev[b];
      return x[0] - y[0] || (x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0) || freesFirst(x) - freesFirst(y);
    });
    const peak = Array.from(staticBytes), peakInflight = new Array(K).fill(0), versions = new Array(K).fill(0);
    const steps = [];
    for (let d = 0; d < K; d++) steps.push({time: [0.0], bytes: [staticBytes[d]]});
    const cum = new Float64Array(K), inflight = new Float64Array(K), vers = new Float64Array(K);
    const overflow = [];
    const firstOver = new Array(K).fill(null), peakTime = new Array(K).fill(0.0);
    const cap = capacity == null ? Infinity : capacity;
    if (staticBytes.some((b) => b > cap)) staticBytes.forEach((b, d) => { if (b > cap) firstOver[d] = 0.0; });
    for (const j of order) {
      const [d, t, b, f, v] = ev[j];
      cum[d] += b; inflight[d] += f; vers[d] += v;
      const level = staticBytes[d] + cum[d];
      if (level > peak[d]) { peak[d] = level; peakTime[d] = t; }
      if (level > cap && firstOver[d] === null) firstOver[d] = t;
      if (inflight[d] > peakInflight[d]) peakInflight[d] = inflight[d];
      if (vers[d] > versions[d]) versions[d] = vers[d];
      const st = steps[d], last = st.time.length - 1;
      if (st.time[last] === t) st.bytes[last] = level; // events at one instant: keep the level after all
      else { st.time.push(t); st.bytes.push(level); }
    }
    for (let d = 0; d < K; d++) {
      if (peak[d] > cap) overflow.push({device: d, first_time: firstOver[d], peak_time: peakTime[d],
        excess_bytes: peak[d] - cap});
    }
    return {peak, peakInflight, weightVersions: versions.map((v, d) => stagesOn[d] + v), steps, overflow};
  }

  /* One run: schedule + costs + hardware -> timeline arrays, metrics, memory (sim.simulate's fast path). */
  function run(sched, costs, hw, options) {
    const flat = sched.flat || (sched.flat = flatten(sched));
    const p = plan(flat, costs, hw);
    const t = listSchedule(flat, p, hw.overlap !== false);
    const K = flat.K, busy = new Array(K).fill(0.0);
    let makespan = 0.0;
    const first = new Array(K).fill(Infinity), last = new Array(K).fill(-Infinity);
    for (let d = 0; d < K; d++) {
      const a = flat.start[d], b = flat.start[d + 1];
      let total = 0.0;
      for (let i = a; i < b; i++) total += t.end[i] - t.start[i];
      busy[d] = total;
      if (b > a) { first[d] = t.start[a]; last[d] = t.end[b - 1]; }
    }
    for (let i = 0; i < flat.n; i++) {
      if (t.end[i] > makespan) makespan = t.end[i];
      if (p.link[i] >= 0 && t.sentEnd[i] > makespan) makespan = t.sentEnd[i];
    }
    const total = pySum(busy, options && options.compensatedSum);
    const utilization = makespan > 0 ? total / (K * makespan) : 1.0;
    let longest = -1, span = -Infinity; // the zero-bubble papers' bubble rate (sim/results/metrics.py)
    for (let d = 0; d < K; d++) {
      const s = Number.isFinite(first[d]) ? last[d] - first[d] : 0.0;
      if (s > span) { span = s; longest = d; }
    }
    const mem = memory(flat, costs, t, hw.memory_capacity);
    return {
      flat, plan: p, times: t, busy, makespan, utilization, bubble_fraction: 1.0 - utilization,
      bubble_ratio: total > 0 ? (K * makespan - total) / total : 0.0,
      bubble_rate_zb: longest >= 0 && span > 0 ? (span - busy[longest]) / span : 0.0,
      peak_memory: mem.peak, peak_inflight: mem.peakInflight, weight_versions: mem.weightVersions,
      memory: mem,
    };
  }

  PS.engine = {NUM_KINDS, OP_F, OP_B, OP_W, OP_R, OP_U, KINDS, pySum, flatten, uniformCosts, plan, listSchedule,
    memory, run};
})(globalThis.PS = globalThis.PS || {});
