/* Each schedule's closed-form utilization for uniform stages on free links: sim/schedules/closed_forms.py,
 * formula by formula (sources there and below), for one iteration without recompute (the playground's case).
 * NaN where a schedule has none or its source's conditions do not hold: "simulate it". K devices, M micro-batches,
 * v chunks per device, F, B, W: one device's share of forward, input-gradient and weight-gradient time. */
(function (PS) {
  "use strict";

  const FORMULAS = {
    // one micro-batch in flight (GPipe, Huang et al. 2019, fig. 2b)
    naive: {text: "1 / K", f: (K) => 1 / K},
    // GPipe, Huang et al. 2019, section 2.2: bubble (K-1)/(M+K-1)
    gpipe: {text: "M / (M + K - 1)", f: (K, M) => M / (M + K - 1)},
    // 1F1B keeps GPipe's bubble (Narayanan et al., PipeDream-Flush, ICML 2021)
    "1f1b": {text: "M / (M + K - 1)", f: (K, M) => M / (M + K - 1)},
    // PipeDream (SOSP 2019), PipeDream-2BW (ICML 2021): warm-up and cool-down once in N iterations (N = 1 here)
    pipedream: {text: "N·M / (N·M + K - 1)", f: (K, M) => 1 * M / (1 * M + K - 1)},
    "pipedream-2bw": {text: "N·M / (N·M + K - 1)", f: (K, M) => 1 * M / (1 * M + K - 1)},
    // Megatron, Narayanan et al., SC'21, section 2.2.2: bubble (K-1)/(v·M+K-1); M a multiple of K when v > 1
    "interleaved-1f1b": {text: "v·M / (v·M + K - 1)", f: (K, M, v) => (v > 1 && M % K ? NaN : v * M / (v * M + K - 1))},
    // Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3.1: idle (K-1)(F+B-W) per device, M >= K
    "zb-h1": {text: "M(F+B+W) / (M(F+B+W) + (K-1)(F+B-W)), M ≥ K", f: (K, M, v, F, B, W) => {
      if (M < K) return NaN;
      const work = M * (F + B + W);
      return work > 0 ? work / (work + (K - 1) * (F + B - W)) : NaN;
    }},
    // Qi et al. (ICLR 2024), section 3.1: one iteration idles (K-1) max(F, F+B-2W) per device, M >= 2K-1
    "zb-h2": {text: "M(F+B+W) / (M(F+B+W) + (K-1)·max(F, F+B-2W)), M ≥ 2K-1", f: (K, M, v, F, B, W) => {
      if (M < 2 * K - 1) return NaN;
      const work = M * (F + B + W);
      return work > 0 ? work / (work + (K - 1) * Math.max(F, F + B - 2 * W)) : NaN;
    }},
    // Qi et al. (ICLR 2024), section 6: (K-1)F/2 idle per device for F = B = W, M >= 2K-1
    zbv: {text: "6M / (6M + K - 1), F = B = W, M ≥ 2K-1", f: (K, M, v, F, B, W) => (
      !(F === B && B === W && W > 0) || M < 2 * K - 1 ? NaN : 6 * M / (6 * M + K - 1))},
  };

  /* {value, text}: the utilization the schedule's source predicts (NaN: none here) and the formula. */
  function closedForm(name, K, M, v, F, B, W) {
    const entry = FORMULAS[name];
    if (!entry || K < 1 || M < 1) return {value: NaN, text: null};
    if (F + B + W <= 0) return {value: NaN, text: entry.text};
    return {value: entry.f(K, M, v, F, B, W), text: entry.text};
  }

  PS.closedForm = closedForm;
})(globalThis.PS = globalThis.PS || {});
