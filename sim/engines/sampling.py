"""Monte Carlo runs of one schedule: many samples of random durations, one compiled call over all of them.

The fast engine's list scheduler (:mod:`sim.engines.fastpath`) walks the devices as far as their inputs allow. The
order in which it fixes actions depends only on which inputs exist, never on their times, and a directed link
serves its transfers in the sending device's order. So one topological order (:func:`topological_order`, computed
once) serves every sample: each sample is one pass over that order with the same arithmetic as the list
scheduler (``start = max(device free, inputs)``, ``end = start + (overhead + duration)``, a transfer starts when
its link is free, an overlapped pair's forward send holds a blocking sender only after the pair's backward half),
which gives the list scheduler's floats exactly when nothing varies (``tests/test_montecarlo.py``,
``tests/test_montecarlo_runtime.py``).

The runtime model's dispatch overhead (:attr:`sim.engines.plan.Plan.overhead`) is a fixed cost in every sample:
the device is held for it before the action computes, as in :mod:`sim.engines.fastpath`; it is not busy time and
no variability source scales it (why: see :func:`_sample_kernel`).

Random numbers are counter-based (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the mixer
is SplitMix64's finaliser, Steele et al., OOPSLA'14): each draw is a hash of (seed, sample, stream, index), where
the index of a computation's or transfer's draw is its action key. Hence a sample can be re-run alone (the Gantt of
the p99 sample), no draw depends on the order of the others, and two schedules given the same seed see the same
factor for the same action (common random numbers: their difference has less noise than either).

Each sample reports its makespan, per device its busy seconds (the drawn compute durations; pauses and dispatch
overhead excluded), whether the device lies on the sample's critical path and how many seconds of that path it
holds (its actions' dispatch overhead included: the device is held for it): the path is
followed back from the last end through whatever bound each start (the device's previous action, an input, or
the link's previous transfer), as in the critical-path analysis of Megatron-LM's straggler detector and of the
OSDI'25 straggler study ("who made it slow").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim import jit
from sim.core.ir import NUM_KINDS, OP_B, OP_W, key_kind, key_stage
from sim.engines.plan import Plan
from sim.engines.variability import EMPIRICAL_KINDS, Variability, VariabilityError

__all__ = ["SampleArrays", "run_samples", "replay_sample", "draw_samples", "topological_order", "encode_variability", "python_draws",
           "DISTRIBUTION_CODES", "STREAM_COMPUTE", "STREAM_STRAGGLER"]

# distribution codes of the kernel
_NONE, _LOGNORMAL, _NORMAL, _EMPIRICAL = 0, 1, 2, 3
_CODES = {"none": _NONE, "lognormal": _LOGNORMAL, "normal": _NORMAL, "empirical": _EMPIRICAL}
DISTRIBUTION_CODES = _CODES
# random streams: one per source, so that adding a source never changes the draws of another
_S_COMPUTE, _S_LINK, _S_STRAGGLER, _S_SLOW_LINK, _S_PAUSE = 1, 2, 3, 4, 5
STREAM_COMPUTE, STREAM_STRAGGLER = _S_COMPUTE, _S_STRAGGLER

# SplitMix64 constants (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA'14, fig. 2)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SH30, _SH27, _SH31, _SH11, _SH48 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11), np.uint64(48)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53: the top 53 bits of a draw as a double in [0, 1)


def _mix(z):
    """SplitMix64's finaliser: a bijection of uint64 whose outputs look independent for consecutive inputs."""
    z = (z ^ (z >> _SH30)) * _MIX1
    z = (z ^ (z >> _SH27)) * _MIX2
    return z ^ (z >> _SH31)


def _sample_key(seed, sample):
    """The key of one sample's draws (uint64)."""
    return _mix(_mix(np.uint64(seed) ^ _GOLDEN) + _GOLDEN * np.uint64(sample + 1))


def _uniform(key, stream, index):
    """A uniform draw in [0, 1) for (sample key, stream, index); index < 2**48."""
    z = _mix(key + _GOLDEN * ((np.uint64(stream) << _SH48) + np.uint64(index) + np.uint64(1)))
    return float(z >> _SH11) * _TO_UNIT


# Acklam's rational approximation of the normal quantile (P. J. Acklam, "An algorithm for computing the inverse
# normal cumulative distribution function", 2003; relative error below 1.2e-9): one uniform per normal draw and no
# transcendental function in the central 95 % (Box-Muller costs a log, a sqrt and a cos per draw).
_A1, _A2, _A3 = -3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02
_A4, _A5, _A6 = 1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00
_B1, _B2, _B3 = -5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02
_B4, _B5 = 6.680131188771972e+01, -1.328068155288572e+01
_C1, _C2, _C3 = -7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00
_C4, _C5, _C6 = -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00
_D1, _D2, _D3, _D4 = 7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00
_P_LOW = 0.02425


def _normal(key, stream, index):
    """A standard normal draw: the normal quantile of one uniform (Acklam's approximation, above)."""
    p = _uniform(key, stream, index)
    if p < _P_LOW:
        if p <= 0.0:
            p = _TO_UNIT  # the smallest draw above 0: z = -8.1, not -inf
        q = math.sqrt(-2.0 * math.log(p))
        return (((((_C1 * q + _C2) * q + _C3) * q + _C4) * q + _C5) * q + _C6) / \
            ((((_D1 * q + _D2) * q + _D3) * q + _D4) * q + 1.0)
    if p > 1.0 - _P_LOW:
        q = math.sqrt(-2.0 * math.log(1.0 - p))
        return -(((((_C1 * q + _C2) * q + _C3) * q + _C4) * q + _C5) * q + _C6) / \
            ((((_D1 * q + _D2) * q + _D3) * q + _D4) * q + 1.0)
    q = p - 0.5
    r = q * q
    return (((((_A1 * r + _A2) * r + _A3) * r + _A4) * r + _A5) * r + _A6) * q / \
        (((((_B1 * r + _B2) * r + _B3) * r + _B4) * r + _B5) * r + 1.0)


def _factor(code, cv, mu, sigma, key, stream, index):
    """A mean-1 random factor: lognormal (exp(mu + sigma z), sigma^2 = ln(1 + cv^2), mu = -sigma^2/2, so that
    E = 1 and std = cv: the lognormal's moments) or normal 1 + cv z truncated at 0 (redrawn while <= 0; the
    draws are a counter family, so redraw r uses indices shifted by r * 2**36)."""
    if code == _LOGNORMAL:
        return math.exp(mu + sigma * _normal(key, stream, index))
    tries = 0
    while True:
        value = 1.0 + cv * _normal(key, stream, index + tries * 68719476736)
        if value > 0.0 or tries >= 64:  # 64 redraws at cv <= MAX_CV: P(all fail) < 0.46**64 ~ 1e-22
            return value if value > 0.0 else 0.0
        tries += 1


def _paused_end(start, work, every, length, phase):
    """When *work* seconds of computation started at *start* end on a device that pauses for *length* seconds
    at phase + k * every (k integer): time inside a pause does no work."""
    period_work = every - length
    r = (start - phase) % every  # position in the current period; pauses occupy [0, length)
    t = start
    if r < length:
        t += length - r
        r = length
    window = every - r  # work left before the next pause
    if work <= window:
        return t + work
    work -= window
    full = math.floor(work / period_work)
    rest = work - full * period_work
    if rest <= 0.0:  # ends exactly where a pause starts: after *full* periods of pause then work
        return t + window + full * every
    return t + window + full * every + length + rest


def _sample_kernel(order, device, dep_start, dep_slot, keys, base, overhead, paired, link, base_send, links,
                   overlap, K, c_code, c_cv, pool_a, pool_b, pool_start, pool_values, l_code, l_cv,
                   st_device, st_factor, st_prob, sl_link, sl_factor, sl_prob,
                   p_every, p_length, p_device, p_aligned, seed, first, count, keep,
                   makespan_out, busy_out, on_path_out, path_out, link_path_out,
                   start_out, end_out, tx_start_out, tx_end_out):
    """Samples first .. first+count-1; results into the *_out arrays (row j: sample first + j). With keep >= 0,
    sample *keep* (of this call: first + keep) also writes its per-action times into start/end/tx_*_out.

    *base*: the planned durations (:attr:`sim.engines.plan.Plan.durations`), which the variability scales.
    *overhead*: the runtime's dispatch overhead before each action (:attr:`sim.engines.plan.Plan.overhead`),
    which holds the device but is not scaled: it is the host's time to launch the action (Python dispatch,
    bookkeeping; issue 27 calibrates it from trace gaps), not the accelerator's computation that a lognormal
    factor, a straggling device (thermal throttling, a slow GPU) or an empirical pool of measured compute
    durations describes; a straggler's slow host would be a different source. A pause (GC, a checkpoint write)
    stops the whole process, so it stops the dispatch too: a pause applies to overhead + duration.
    *paired*: the forward of an overlapped pair (:attr:`sim.engines.plan.Plan.paired`): with blocking sends its
    send holds the device only once the pair's backward half is done (:func:`sim.core.listsched._list_schedule`).
    """
    n = len(order)
    has_overhead = False
    for i in range(n):
        if overhead[i] != 0.0:
            has_overhead = True
            break
    c_sigma = math.sqrt(math.log1p(c_cv * c_cv))
    c_mu = -0.5 * c_sigma * c_sigma
    l_sigma = math.sqrt(math.log1p(l_cv * l_cv))
    l_mu = -0.5 * l_sigma * l_sigma
    ready = np.zeros(2 * n)  # slot -> time: i the end of action i, n + i the arrival of its result
    start_of = np.zeros(n)
    tx_begin = np.zeros(n)
    why = np.full(n, -1, dtype=np.int64)  # action -> the slot that bound its start (-1: t = 0)
    tx_why = np.full(n, -1, dtype=np.int64)  # transfer -> the slot that bound its start (its producer, or the link)
    device_free = np.zeros(K)
    free_slot = np.full(K, -1, dtype=np.int64)
    held = np.full(K, -1.0)  # device -> end of a pair's forward send that holds it once the pair's backward is done
    held_slot = np.full(K, -1, dtype=np.int64)
    link_free = np.zeros(max(links, 1))
    link_last = np.full(max(links, 1), -1, dtype=np.int64)
    dev_factor = np.ones(K)
    link_factor = np.ones(max(links, 1))
    phase = np.zeros(K)
    for j in range(count):
        key = _sample_key(seed, first + j)
        dev_factor[:] = 1.0
        link_factor[:] = 1.0
        for g in range(len(st_device)):
            if _uniform(key, _S_STRAGGLER, 2 * g) < st_prob[g]:
                d = st_device[g]
                if d < 0:
                    d = min(int(_uniform(key, _S_STRAGGLER, 2 * g + 1) * K), K - 1)
                dev_factor[d] *= st_factor[g]
        for g in range(len(sl_link)):
            if sl_link[g] >= 0 and _uniform(key, _S_SLOW_LINK, g) < sl_prob[g]:
                link_factor[sl_link[g]] *= sl_factor[g]
        if p_length > 0.0:
            for d in range(K):
                phase[d] = 0.0 if p_aligned else _uniform(key, _S_PAUSE, d) * p_every
        device_free[:] = 0.0
        free_slot[:] = -1
        held[:] = -1.0
        link_free[:] = 0.0
        link_last[:] = -1
        last = 0.0
        last_slot = -1
        for t in range(n):
            i = order[t]
            d = device[i]
            start = device_free[d]
            bound = free_slot[d]
            for q in range(dep_start[i], dep_start[i + 1]):
                p = dep_slot[q]
                if ready[p] > start:
                    start = ready[p]
                    bound = p
            k = keys[i]
            if c_code == _EMPIRICAL and pool_a[i] >= 0:
                a = pool_a[i]
                size = pool_start[a + 1] - pool_start[a]
                dur = pool_values[pool_start[a] + min(int(_uniform(key, _S_COMPUTE, 2 * k) * size), size - 1)]
                b = pool_b[i]
                if b >= 0:  # a full backward where the measured run split it: B and W drawn apart
                    size = pool_start[b + 1] - pool_start[b]
                    dur += pool_values[pool_start[b] + min(int(_uniform(key, _S_COMPUTE, 2 * k + 1) * size), size - 1)]
            elif c_code == _LOGNORMAL or c_code == _NORMAL:
                dur = base[i] * _factor(c_code, c_cv, c_mu, c_sigma, key, _S_COMPUTE, k)
            else:
                dur = base[i]
            dur *= dev_factor[d]
            busy_out[j, d] += dur  # the computation alone: the dispatch overhead is not busy (sim.results.metrics)
            oh = overhead[i] if has_overhead else 0.0  # a load fewer per action without overheads
            work = oh + dur  # the device is held for the overhead, then computes: Plan.occupy's sum, the same floats
            if p_length > 0.0 and work > 0.0 and (p_device < 0 or p_device == d):
                end = _paused_end(start, work, p_every, p_length, phase[d])
                begin = _paused_end(start, oh, p_every, p_length, phase[d]) if oh > 0.0 else start
            else:
                end = start + work
                begin = start + oh  # as sim.engines.fastpath: the computation starts after the overhead
            if keep == j:
                start_out[i] = begin
            start_of[i] = start  # the device is held from here: the critical path counts the overhead
            why[i] = bound
            ready[i] = end
            device_free[d] = end
            free_slot[d] = i
            if end > last:
                last = end
                last_slot = i
            lk = link[i]
            if lk >= 0:
                t0 = end
                tx_why[i] = i
                if link_free[lk] > t0:
                    t0 = link_free[lk]
                    tx_why[i] = n + link_last[lk]
                seconds = base_send[i] * link_factor[lk]
                if l_code == _LOGNORMAL or l_code == _NORMAL:
                    seconds *= _factor(l_code, l_cv, l_mu, l_sigma, key, _S_LINK, k)
                t1 = t0 + seconds
                link_free[lk] = t1
                link_last[lk] = i
                ready[n + i] = t1
                tx_begin[i] = t0
                if not overlap:
                    if paired[i]:  # a pair's forward: its send holds the device after the pair's backward
                        held[d] = t1
                        held_slot[d] = n + i
                    else:
                        device_free[d] = t1  # a blocking send keeps the sender busy until the data has left
                        free_slot[d] = n + i
                if t1 > last:
                    last = t1
                    last_slot = n + i
                if keep == j:
                    tx_start_out[i] = t0
                    tx_end_out[i] = t1
            if held[d] >= 0.0 and not paired[i]:  # the pair is done: its forward's send holds the device now
                if held[d] > device_free[d]:
                    device_free[d] = held[d]
                    free_slot[d] = held_slot[d]
                held[d] = -1.0
        makespan_out[j] = last
        p = last_slot  # follow the critical path back from the last end
        while p >= 0:
            if p < n:
                d = device[p]
                on_path_out[j, d] = True
                path_out[j, d] += ready[p] - start_of[p]
                p = why[p]
            else:
                i = p - n
                link_path_out[j] += ready[p] - tx_begin[i]
                p = tx_why[i]
        if keep == j:
            for i in range(n):
                end_out[i] = ready[i]
    return 0


def _draw_kernel(device, keys, base, link, base_send, K, c_code, c_cv, pool_a, pool_b, pool_start, pool_values,
                 l_code, l_cv, st_device, st_factor, st_prob, sl_link, sl_factor, sl_prob, seed, first, count,
                 dur_out, send_out):
    """The durations and transfer seconds samples first .. first+count-1 draw (row j: sample first + j), without
    scheduling them: for engines that walk a lowered program (:func:`draw_samples`). The same draws and the same
    arithmetic as :func:`_sample_kernel`'s, statement for statement, so the floats are identical
    (``tests/test_montecarlo_rendezvous.py`` checks the eager walk of these against the kernel's makespans)."""
    n = len(keys)
    c_sigma = math.sqrt(math.log1p(c_cv * c_cv))
    c_mu = -0.5 * c_sigma * c_sigma
    l_sigma = math.sqrt(math.log1p(l_cv * l_cv))
    l_mu = -0.5 * l_sigma * l_sigma
    dev_factor = np.ones(K)
    link_factor = np.ones(max(n, 1))  # indexed by link number, < n
    for j in range(count):
        key = _sample_key(seed, first + j)
        dev_factor[:] = 1.0
        link_factor[:] = 1.0
        for g in range(len(st_device)):
            if _uniform(key, _S_STRAGGLER, 2 * g) < st_prob[g]:
                d = st_device[g]
                if d < 0:
                    d = min(int(_uniform(key, _S_STRAGGLER, 2 * g + 1) * K), K - 1)
                dev_factor[d] *= st_factor[g]
        for g in range(len(sl_link)):
            if sl_link[g] >= 0 and _uniform(key, _S_SLOW_LINK, g) < sl_prob[g]:
                link_factor[sl_link[g]] *= sl_factor[g]
        for i in range(n):
            d = device[i]
            k = keys[i]
            if c_code == _EMPIRICAL and pool_a[i] >= 0:
                a = pool_a[i]
                size = pool_start[a + 1] - pool_start[a]
                dur = pool_values[pool_start[a] + min(int(_uniform(key, _S_COMPUTE, 2 * k) * size), size - 1)]
                b = pool_b[i]
                if b >= 0:
                    size = pool_start[b + 1] - pool_start[b]
                    dur += pool_values[pool_start[b] + min(int(_uniform(key, _S_COMPUTE, 2 * k + 1) * size), size - 1)]
            elif c_code == _LOGNORMAL or c_code == _NORMAL:
                dur = base[i] * _factor(c_code, c_cv, c_mu, c_sigma, key, _S_COMPUTE, k)
            else:
                dur = base[i]
            dur *= dev_factor[d]
            dur_out[j, i] = dur
            lk = link[i]
            if lk >= 0:
                seconds = base_send[i] * link_factor[lk]
                if l_code == _LOGNORMAL or l_code == _NORMAL:
                    seconds *= _factor(l_code, l_cv, l_mu, l_sigma, key, _S_LINK, k)
                send_out[j, i] = seconds
    return 0


def _order_kernel(device_start, dep_start, dep_slot, n):
    """The order in which the list scheduler (:func:`sim.engines.fastpath._list_schedule`) fixes actions: the
    same walk without times. Returns the order (its first *filled* entries) and how far each device got (a
    device short of its end is stuck: a deadlock)."""
    K = len(device_start) - 1
    done = np.zeros(2 * n, dtype=np.bool_)
    head = np.full(2 * n, -1, dtype=np.int64)
    next_waiting = np.full(max(K, 1), -1, dtype=np.int64)
    position = device_start[:K].copy()
    order = np.empty(n, dtype=np.int64)
    filled = 0
    todo = np.arange(K)[::-1].copy()
    count = K
    while count > 0:
        count -= 1
        d = todo[count]
        i = position[d]
        last = device_start[d + 1]
        while i < last:
            blocked = -1
            for q in range(dep_start[i], dep_start[i + 1]):
                if not done[dep_slot[q]]:
                    blocked = dep_slot[q]
                    break
            if blocked >= 0:
                next_waiting[d] = head[blocked]
                head[blocked] = d
                break
            order[filled] = i
            filled += 1
            for slot in (i, n + i):  # its end, and its result's arrival (set even where nothing is sent)
                done[slot] = True
                w = head[slot]
                head[slot] = -1
                while w >= 0:
                    todo[count] = w
                    count += 1
                    w = next_waiting[w]
            i += 1
        position[d] = i
    return order[:filled], position


def topological_order(plan: Plan) -> np.ndarray:
    """Actions of *plan* in the order every sample computes them; a schedule that deadlocks raises
    :class:`~sim.core.ir.ScheduleError` naming the stuck actions (as the fast engine does)."""
    flat = plan.flat
    kernel = jit.compiled(_order_kernel) or _order_kernel  # no callees: compiled as it is
    order, position = kernel(flat.device_start, flat.dep_start, flat.dep_slot, len(flat.keys))
    if len(order) < len(flat.keys):
        raise plan.schedule.deadlock_error(position)
    return order


def encode_variability(plan: Plan, variability: Variability) -> tuple:
    """The kernel's variability arguments for *plan* (see :func:`_sample_kernel`)."""
    schedule = plan.schedule
    variability.check_devices(schedule.devices)
    keys = plan.flat.keys
    n = len(keys)
    pool_a = np.full(n, -1, dtype=np.int64)
    pool_b = np.full(n, -1, dtype=np.int64)
    pool_start = np.zeros(1, dtype=np.int64)
    pool_values = np.zeros(0)
    compute = variability.compute
    if compute.kind == "empirical":
        pool_a, pool_b, pool_start, pool_values = _empirical_pools(plan, compute)
    # links: the kernel numbers the directed links in use; a slow link not in use slows nothing (-1)
    sl = variability.slow_links
    number: dict[tuple[int, int], int] = {}
    if sl:  # (src, dst) -> the link's number, read off the transfers (only when a slow link asks)
        sent = np.flatnonzero(plan.link >= 0)
        pairs = np.unique(np.stack([plan.flat.device[sent], plan.flat.send_to[sent], plan.link[sent]], axis=1), axis=0)
        number = {(int(a), int(b)): int(lk) for a, b, lk in pairs.tolist()}
    st = variability.stragglers
    pause = variability.pause
    return (_CODES[compute.kind] if compute.active else _NONE, float(compute.cv), pool_a, pool_b, pool_start,
            pool_values, _CODES[variability.links.kind] if variability.links.active else _NONE,
            float(variability.links.cv),
            np.array([-1 if s.device is None else s.device for s in st], dtype=np.int64),
            np.array([s.factor for s in st], dtype=float), np.array([s.prob for s in st], dtype=float),
            np.array([number.get((s.src, s.dst), -1) for s in sl], dtype=np.int64),
            np.array([s.factor for s in sl], dtype=float), np.array([s.prob for s in sl], dtype=float),
            float(pause.every) if pause else 1.0, float(pause.length) if pause else 0.0,
            -1 if pause is None or pause.device is None else pause.device, bool(pause and pause.aligned))


def _empirical_pools(plan: Plan, compute) -> tuple:
    """Per action the pool its duration is drawn from (and a second one, W, for a full backward where the measured
    run split B and W); pools as CSR arrays. Actions of zero planned duration that were not measured keep 0."""
    schedule = plan.schedule
    if len(schedule.fused):
        raise VariabilityError("empirical resampling cannot split an overlapped forward-backward pair's duration; "
                               "use lognormal:CV or normal:CV for this schedule")
    keys = plan.flat.keys
    S = schedule.stages
    stages_measured = {stage for stage, _ in compute.pools}
    if max(stages_measured) >= S:
        raise VariabilityError(f"the empirical timeline {compute.source!r} has stage {max(stages_measured)} but the "
                               f"schedule has stages 0..{S - 1}; measure the same partition")
    names = sorted(compute.pools)
    index = {name: g for g, name in enumerate(names)}
    pool_start = np.zeros(len(names) + 1, dtype=np.int64)
    pool_start[1:] = np.cumsum([len(compute.pools[k]) for k in names])
    pool_values = np.concatenate([np.asarray(compute.pools[k], dtype=float) for k in names])
    kind, stage = key_kind(keys), key_stage(keys, S)
    has_w = np.isin(keys + (OP_W - OP_B), keys[kind == OP_W]) & (kind == OP_B)
    pool_a = np.full(len(keys), -1, dtype=np.int64)
    pool_b = np.full(len(keys), -1, dtype=np.int64)
    missing: set[tuple[int, str]] = set()
    table = np.full((S, NUM_KINDS), -1, dtype=np.int64)
    for (s, letter), g in index.items():
        table[s, EMPIRICAL_KINDS.index(letter)] = g
    pool_a[:] = table[stage, kind]
    w_pool = table[stage, OP_W]
    full_b = (kind == OP_B) & ~has_w & (w_pool >= 0)  # the run measured B and W apart, the schedule runs B+W
    pool_b[full_b] = w_pool[full_b]
    lacking = (pool_a < 0) & (plan.durations > 0)
    for i in np.flatnonzero(lacking)[:200].tolist():
        missing.add((int(stage[i]), EMPIRICAL_KINDS[int(kind[i])]))
    if missing:
        listed = ", ".join(f"stage {s} {k}" for s, k in sorted(missing)[:6])
        raise VariabilityError(f"the empirical timeline {compute.source!r} has no measured durations for {listed}"
                               f"{' ...' if len(missing) > 6 else ''}; measure a run of the same schedule kinds, or "
                               f"use lognormal:CV")
    return pool_a, pool_b, pool_start, pool_values


@dataclass(frozen=True, slots=True)
class SampleArrays:
    """What every sample of a Monte Carlo run gave (row j: sample j)."""

    makespan: np.ndarray
    """float64[samples]: seconds."""
    busy: np.ndarray
    """float64[samples, K]: seconds each device computed (the drawn durations; pauses and dispatch overhead
    excluded, as busy time in :mod:`sim.results.metrics`)."""
    on_critical_path: np.ndarray
    """bool[samples, K]: the device holds at least one action of the sample's critical path."""
    critical_seconds: np.ndarray
    """float64[samples, K]: seconds of the critical path the device held for its actions (their computations,
    dispatch overhead and any pause inside them; under a rendezvous runtime its post calls too:
    :class:`sim.engines.rendezvous.CriticalPath`)."""
    critical_link_seconds: np.ndarray
    """float64[samples]: seconds of the critical path spent in transfers."""


def run_samples(plan: Plan, variability: Variability, *, samples: int, seed: int, order: np.ndarray | None = None,
                first: int = 0) -> SampleArrays:
    """Samples *first* .. *first* + *samples* - 1 of *plan* under *variability*, all in one compiled call."""
    order = topological_order(plan) if order is None else order
    K = plan.schedule.devices
    out = SampleArrays(np.zeros(samples), np.zeros((samples, K)), np.zeros((samples, K), dtype=np.bool_),
                       np.zeros((samples, K)), np.zeros(samples))
    scratch = np.zeros(0)
    _call(plan, order, variability, seed, first, samples, -1, out, scratch, scratch, scratch, scratch)
    return out


def replay_sample(plan: Plan, variability: Variability, *, sample: int, seed: int,
                  order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sample *sample* again, with its per-action times: start, end, transfer start, transfer end (in the order of
    :attr:`sim.core.compiled.Compiled.flat`; the transfer arrays are 0 where nothing is sent)."""
    order = topological_order(plan) if order is None else order
    n, K = len(plan.flat.keys), plan.schedule.devices
    out = SampleArrays(np.zeros(1), np.zeros((1, K)), np.zeros((1, K), dtype=np.bool_), np.zeros((1, K)), np.zeros(1))
    times = tuple(np.zeros(n) for _ in range(4))
    _call(plan, order, variability, seed, sample, 1, 0, out, *times)
    return times


_HELPERS = ("_mix", "_sample_key", "_uniform", "_normal", "_factor", "_paused_end")
_compiled: dict[str, object] = {}


def draw_samples(plan: Plan, variability: Variability, *, first: int, count: int, seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(durations, send seconds) of samples *first* .. *first* + *count* - 1, float64[count, n] each in the order of
    :attr:`sim.core.compiled.Compiled.flat`: what :func:`run_samples` draws for the same samples, for an engine that
    schedules them itself (the rendezvous engine, :mod:`sim.engines.rendezvous`). Pauses depend on when an action
    runs, so they are refused here."""
    if variability.pause is not None:
        raise VariabilityError("pauses are drawn while the schedule runs: the rendezvous runtimes' Monte Carlo does "
                               "not take --pause; drop it or use --runtime pipesim")
    n = len(plan.flat.keys)
    durations, sends = np.zeros((count, n)), np.zeros((count, n))
    encoded = encode_variability(plan, variability)[:14]  # everything but the pause
    _compiled_kernel()
    kernel = _compiled.get("draw") or _draw_kernel
    with np.errstate(over="ignore"):
        kernel(plan.flat.device, plan.flat.keys, plan.durations, plan.link, plan.send_seconds, plan.schedule.devices,
               *encoded, np.uint64(int(seed) % (1 << 64)), first, count, durations, sends)
    return durations, sends


def python_draws(seed: int, sample: int):
    """(uniform, factor) of one sample for Python callers (the validator's injection): ``uniform(stream, index)``
    and ``factor(code, cv, stream, index)`` give exactly the kernel's draws of that sample."""
    with np.errstate(over="ignore"):  # uint64 products wrap, as they should
        key = _sample_key(np.uint64(seed), sample)

    def uniform(stream: int, index: int) -> float:
        with np.errstate(over="ignore"):
            return _uniform(key, stream, index)

    def factor(code: int, cv: float, stream: int, index: int) -> float:
        sigma = math.sqrt(math.log1p(cv * cv))
        with np.errstate(over="ignore"):
            return _factor(code, cv, -0.5 * sigma * sigma, sigma, key, stream, index)

    return uniform, factor


def _compiled_kernel():
    """:func:`_sample_kernel` compiled by numba, or None without numba. numba compiles a kernel's callees only if
    they are compiled functions themselves, so the kernel and its helpers are compiled as copies of the same code
    whose globals name the compiled helpers; this module's own functions stay plain Python (the validator calls
    them, :func:`python_draws`)."""
    if "kernel" not in _compiled:
        if jit.compiled(_mix) is None:  # no numba
            _compiled["kernel"] = _compiled["draw"] = None
            return None
        import types

        names = dict(globals())  # the copies resolve their callees here: the compiled helpers
        for name in _HELPERS + ("_sample_kernel", "_draw_kernel"):
            original = globals()[name]
            copy = types.FunctionType(original.__code__, names, name, original.__defaults__)
            copy.__qualname__ = f"{name}_compiled"
            # the helpers as numba dispatchers: jit.compiled wraps each in a Python function that holds signals
            # back (sim.jit), which compiled code cannot call; the kernel keeps that wrapper (it is called from
            # Python)
            wrapped = jit.compiled(copy)
            names[name] = wrapped if name in ("_sample_kernel", "_draw_kernel") else getattr(wrapped, "dispatcher",
                                                                                              wrapped)
        _compiled["kernel"] = names["_sample_kernel"]
        _compiled["draw"] = names["_draw_kernel"]
    return _compiled["kernel"]


def _call(plan: Plan, order, variability: Variability, seed: int, first: int, count: int, keep: int,
          out: SampleArrays, *times) -> None:
    flat = plan.flat
    seed_u64 = int(seed) % (1 << 64)
    kernel = _compiled_kernel()
    with np.errstate(over="ignore"):  # interpreted (no numba), uint64 products wrap as they should, with a warning
        (kernel or _sample_kernel)(
            order, flat.device, flat.dep_start, flat.dep_slot, flat.keys, plan.durations, plan.overhead,
            plan.paired, plan.link, plan.send_seconds, plan.links, bool(plan.hardware.overlap), plan.schedule.devices,
            *encode_variability(plan, variability), np.uint64(seed_u64), first, count, keep,
            out.makespan, out.busy, out.on_critical_path, out.critical_seconds, out.critical_link_seconds, *times)
