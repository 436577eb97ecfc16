"""The executor's own overhead per action: measured around every action, and part of the prediction.

The executor tests run one rank on a fake clock (every clock read in the executor and the
tracer), a fake stage and a fake comm that advance it by known amounts, so the measured
overhead is exact: no timing in these tests.
"""

import pytest

torch = pytest.importorskip("torch")

from sim import schedules  # noqa: E402
from sim.model.cost import COLUMNS, uniform  # noqa: E402
from validate.rank import executor as executor_module  # noqa: E402
from validate.rank import tracing as tracing_module  # noqa: E402
from validate.predict.calibrate import assemble, fit_link, in_schedule_overhead, with_overhead  # noqa: E402
from validate.rank.executor import Executor  # noqa: E402
from validate.rank.tracing import Tracer  # noqa: E402
from validate.rank.workloads import Sleeper  # noqa: E402

COMPUTE, SEND, WAIT, POST = 1000.0, 7.0, 100.0, 3.0
"""Fake seconds: one action's compute, issuing a send, blocking for a message, posting a receive."""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Work:
    def __init__(self, clock: _Clock, blocking: float) -> None:
        self.clock, self.blocking, self.done = clock, blocking, False

    def is_completed(self) -> bool:
        return self.done


class _Comm:
    """Sends cost SEND, posting a receive POST; a receive is never complete until waited for (WAIT)."""

    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def isend(self, tensor, dst):
        self.clock.now += SEND
        w = _Work(self.clock, 0.0)
        w.done = True
        return w

    def irecv(self, tensor, src):
        self.clock.now += POST
        return _Work(self.clock, WAIT)

    def wait(self, work) -> None:
        if not work.done:
            self.clock.now += work.blocking
            work.done = True


class _Stage:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock

    def _compute(self):
        self.clock.now += COMPUTE
        return torch.zeros(2)

    def forward(self, mb, x, *, keep_graph=True):
        return self._compute()

    def backward(self, mb, grad_out, *, split):
        self._compute()
        return None  # stage 0: no input gradient to send

    def update(self, u):
        self._compute()


def _overhead_of_rank0(monkeypatch, sched):
    clock = _Clock()
    monkeypatch.setattr(executor_module, "clock", clock)
    monkeypatch.setattr(tracing_module, "clock", clock)
    tracer = Tracer(0, torch.device("cpu"))
    Executor(sched, 0, {0: _Stage(clock)}, _Comm(clock), tracer, inputs=lambda m: torch.zeros(2),
             message_shape=lambda k: (2,), device=torch.device("cpu")).run()
    trace = tracer.finish()
    return {str(sched.action_of(k)): v for k, v in trace.overhead}, trace


def test_overhead_counts_the_executors_own_work_and_not_the_waits(monkeypatch):
    sched = schedules.gpipe(2, 2)  # rank 0: 0F0 0F1 0B0 0B1 0U0 (order as generated)
    overhead, trace = _overhead_of_rank0(monkeypatch, sched)
    assert set(overhead) == {str(a) for a in sched.actions[0]}
    for action, seconds in overhead.items():
        if action.startswith("0F"):
            assert seconds == SEND  # the isend of its output, issued between this action and the next
        elif action.startswith("0B"):
            # blocked WAIT for the gradient is the message's time, not overhead; posting the next receive is
            assert seconds == (POST if action == str(sched.actions[0][2]) else 0.0)
        else:
            assert seconds == 0.0
    # the compute rows are the handlers only: the overhead is outside them
    assert all(end - start == COMPUTE for _, start, end in trace.compute)


def test_overhead_is_measured_not_a_constant(monkeypatch):
    global SEND
    sched = schedules.gpipe(2, 2)
    first, _ = _overhead_of_rank0(monkeypatch, sched)
    old, SEND = SEND, 50.0
    try:
        second, _ = _overhead_of_rank0(monkeypatch, sched)
    finally:
        SEND = old
    assert first["0F0"] == 7.0 and second["0F0"] == 50.0


def test_in_schedule_overhead_is_the_mean_per_stage_and_column():
    sched = schedules.gpipe(2, 3)
    key = sched.key
    f = [a for a in sched.actions[0] if a.kind.value == "F"]
    samples = [(key(f[0]), 1e-4), (key(f[1]), 3e-4), (key(f[2]), 8e-4), (key(sched.actions[0][-1]), -1e-6)]
    per = in_schedule_overhead(sched, samples)
    assert per == {0: {"forward": pytest.approx(4e-4), "update": 0.0}}  # mean of the three; clock jitter < 0 -> 0


def _iso():
    iso = {c: 0.0 for c in COLUMNS}
    iso.update(forward=1e-3, backward=2e-3, weight=0.0, send_bytes=8.0)
    return iso


def test_the_prediction_includes_the_measured_overhead_and_says_so():
    measured = {0: {"forward": 2e-4, "backward": 1e-4}, 1: {"forward": 5e-5, "backward": 3e-4}}
    cal = assemble({0: _iso(), 1: _iso()}, devices=2, ping=None, overhead=1e-6, emulated=True,
                   action_overhead=measured)
    assert cal.costs.forward == pytest.approx((1e-3 + 2e-4, 1e-3 + 5e-5))
    assert cal.costs.backward == pytest.approx((2e-3 + 1e-4, 2e-3 + 3e-4))
    assert cal.costs.update == (0.0, 0.0)  # no U was traced: nothing added
    assert cal.base_costs().forward == pytest.approx((1e-3, 1e-3))  # what the stages themselves take
    d = cal.to_dict()
    assert d["overhead_included"] and d["overhead_source"] == "warm-up run"
    assert d["overhead_per_stage_s"]["1"]["backward"] == 3e-4
    assert any("executor overhead per action added" in n for n in cal.notes)
    # on GPUs host overhead overlaps device work: measured, reported, not added
    gpu = assemble({0: _iso(), 1: _iso()}, devices=2, ping=None, overhead=1e-6, emulated=True,
                   action_overhead=measured, add_overhead=False)
    assert gpu.costs.forward == (1e-3, 1e-3) and not gpu.overhead_included
    assert any("not added" in n for n in gpu.notes)


def test_with_overhead_adds_per_stage_and_column():
    costs = uniform(2, forward=1.0, backward=2.0)
    out = with_overhead(costs, {1: {"forward": 0.5, "update": 0.25}})
    assert out.forward == (1.0, 1.5) and out.update == (0.0, 0.25) and out.backward == (2.0, 2.0)
    assert with_overhead(costs, {}) is costs


def test_emulated_report_predicts_with_the_overhead(tmp_path):
    from validate.run import build_report
    from validate.rank.inprocess import run_in_process
    from validate.request import StageCalibration, WorkloadSpec
    sched = schedules.gpipe(2, 2)
    costs = uniform(2, forward=1e-3, backward=2e-3, send_bytes=64.0)
    spec = WorkloadSpec(name="emulated")
    plain = None
    for extra in (0.0, 5e-4):
        result = run_in_process(sched, spec, costs=costs)
        for r in result["ranks"]:
            stage_costs = {c: getattr(costs, c)[r.rank] for c in COLUMNS}
            r.calibration = StageCalibration(before={r.rank: stage_costs}, after={r.rank: stage_costs}, in_schedule={},
                                             ping=None, overhead=0.0,
                                             action_overhead={r.rank: {"forward": extra, "backward": extra}})
        report = build_report(sched, spec, "gloo", result["ranks"], given_costs=costs, hardware=None, output_dir=None)
        assert report.calibration.costs.forward == pytest.approx((1e-3 + extra, 1e-3 + extra))
        assert report.to_dict()["calibration"]["overhead_per_stage_s"]["0"]["forward"] == extra
        assert report.to_dict()["executor_overhead"]["per_stage_s"]["1"]["backward"] == extra  # the CLI's JSON too
        if plain is None:
            plain = report.predicted.metrics.makespan
        else:  # 2 F and 2 B on the critical path of each device, and more: at least 4 x extra later
            assert report.predicted.metrics.makespan >= plain + 4 * extra - 1e-12


def test_link_fit_is_not_swamped_by_the_largest_message():
    sizes = [4, 1 << 14, 1 << 18, 1 << 20, 1 << 22]
    times = [5e-5 + n / 5e9 for n in sizes]
    times[-1] *= 1.10  # a 10% wobble of the 4 MiB time (84 us)
    latency, bandwidth = fit_link(list(zip(sizes, times)))
    assert latency == pytest.approx(5e-5, rel=0.03)  # 49.5 us; an unweighted fit gives 43.8 us here
    assert bandwidth == pytest.approx(5e9, rel=0.06)


def test_sleeper_wakes_early_by_the_lateness_it_has_seen():
    s = Sleeper()
    assert s.margin() == Sleeper.FIRST_MARGIN  # nothing seen yet
    s.late.extend([1e-4] * 26 + [5e-4] * 6)
    assert s.margin() == 5e-4  # the 90th percentile of the window: a few late wakes count
    s.late.extend([1e-4] * 32)
    assert s.margin() == 1e-4  # the window moved on
    s.late.extend([1.0] * 32)  # preempted sleeps: never spin more than MAX_MARGIN
    assert s.margin() == Sleeper.MAX_MARGIN
    import time
    deadline = time.perf_counter() + 0.003
    s.until(deadline)
    assert time.perf_counter() >= deadline  # never early
    assert len(s.late) == 32  # a bounded window


_FAULTS = """
import ctypes, resource, sys
sys.path.insert(0, {root!r})
from validate.rank.worker import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 64 << 20
counts = []
for _ in range(3):  # what a stage does every action: a large block allocated, written, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, counts[-1])
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc mallopt")
def test_freed_memory_is_kept_so_runs_do_not_refault_it():
    import subprocess
    import sys
    from pathlib import Path
    code = _FAULTS.format(root=str(Path(__file__).resolve().parent.parent))

    def run(mode):
        out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, check=True)
        kept, faults = out.stdout.split()
        return kept, int(faults)

    kept, faults = run("keep")
    if kept != "True":
        pytest.skip("not glibc")
    _, default_faults = run("default")
    assert default_faults > 10_000  # glibc's default: the 64 MiB block is mmapped and unmapped every time
    assert faults < 1_000  # kept: the third allocation reuses mapped pages


def test_gradient_accumulation_owns_fresh_gradients_and_copies_an_aliased_one():
    from validate.rank.workloads import TorchStage, WorkloadSpec, build_stage_module
    spec = WorkloadSpec(name="mlp", width=4, depth=1, batch=2)
    st = TorchStage(spec=spec, stage=0, last=False, group=2, module=build_stage_module(spec, 0),
                    device=torch.device("cpu"))
    names = list(st.versions[0])
    fresh = [torch.ones_like(p) for p in st.versions[0].values()]
    outside = torch.full_like(st.versions[0][names[0]], 2.0)  # e.g. the output gradient autograd was given
    st._accumulate(0, [outside] + fresh[1:], outside)  # the first gradient aliases it: must be copied
    st._accumulate(1, [torch.ones_like(outside)] + fresh[1:], None)
    assert torch.equal(outside, torch.full_like(outside, 2.0))  # untouched by the accumulation
    assert torch.equal(st.grads[0][names[0]], torch.full_like(outside, 3.0))
    assert st.grads[0][names[1]].data_ptr() == fresh[1].data_ptr()  # a fresh gradient is owned, not copied
    assert torch.equal(fresh[1], torch.full_like(fresh[1], 2.0))


def _matmuls_in(fn) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode  # test-only: count the kernels a call runs

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
                Count.n += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return Count.n


def test_a_split_weight_step_does_only_each_layers_own_matmul():
    from validate.rank.workloads import TorchStage, WorkloadSpec, build_stage_module
    spec = WorkloadSpec(name="mlp", width=8, depth=3, batch=4)
    st = TorchStage(spec=spec, stage=1, last=False, group=1, module=build_stage_module(spec, 1),
                    device=torch.device("cpu"))
    x, g = torch.randn(4, 8), torch.randn(4, 8)
    st.forward(0, x)
    b = _matmuls_in(lambda: st.backward(0, g, split=True))
    w = _matmuls_in(lambda: st.weight(0))
    st.forward(1, x)
    full = _matmuls_in(lambda: st.backward(1, g, split=False))
    assert (b, w, full) == (3, 3, 6)  # B: dX per layer; W: dW per layer; together the unsplit backward
    assert torch.allclose(st.grads[0]["0.weight"], st.grads[1]["0.weight"])  # and the same gradient


def test_split_backward_of_a_transformer_stage_gives_the_unsplit_gradients():
    from validate.rank.workloads import TorchStage, WorkloadSpec, build_stage_module
    spec = WorkloadSpec(name="transformer", d_model=16, heads=2, seq=4, batch=2, depth=1)
    st = TorchStage(spec=spec, stage=1, last=False, group=1, module=build_stage_module(spec, 1),
                    device=torch.device("cpu"))
    x, g = torch.randn(2, 4, 16), torch.randn(2, 4, 16)
    st.forward(0, x)
    split_in = st.backward(0, g, split=True)
    st.weight(0)
    st.forward(1, x)
    full_in = st.backward(1, g, split=False)
    assert torch.allclose(split_in, full_in)
    assert set(st.grads[0]) == set(st.grads[1]) == set(st.versions[0])  # out_proj included (MHA never calls it)
    for name in st.grads[1]:
        assert torch.allclose(st.grads[0][name], st.grads[1][name], atol=1e-6), name


def test_one_preempted_action_is_not_charged_to_every_action():
    sched = schedules.gpipe(1, 20)
    key = sched.key
    forwards = [a for a in sched.actions[0] if a.kind.value == "F"]
    samples = [(key(a), 1e-4) for a in forwards[:-1]] + [(key(forwards[-1]), 5e-3)]  # one 5 ms preemption
    assert in_schedule_overhead(sched, samples)[0]["forward"] == pytest.approx(1e-4)  # trimmed away (20 samples)
