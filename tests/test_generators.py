"""Schedule generators: one invariant test over every registered generator, shapes, and golden files.

Golden files: ``tests/golden/<schedule>_K4_M4.txt`` hold ``schedule.to_text()`` for
naive, gpipe, gpipe+recompute, 1f1b and pipedream (K=4, M=4; iterations=2 for
pipedream). A change to a generator's order shows up as a diff of these files. After
an intended change, regenerate them and review the diff::

    PIPESIM_REGEN_GOLDEN=1 /tmp/venv/bin/python -m pytest tests/test_generators.py -q
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from sim.schedules import registry as generators
from sim import schedules
from sim.core.config import ConfigError, PipelineConfig
from sim.core.ir import Action, ActionKind, Schedule

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_CASES = {
    "naive": dict(name="naive"),
    "gpipe": dict(name="gpipe"),
    "gpipe+recompute": dict(name="gpipe", recompute=True),
    "1f1b": dict(name="1f1b"),
    "pipedream": dict(name="pipedream", iterations=2),
}


def _generate(name, K, M, **kw):
    """Generate, skipping a registered schedule's documented refusal of this shape."""
    chunks = getattr(generators.get_generator(name), "CHUNKS", 1) or 2  # 0 / None: any number; try 2
    try:
        return schedules.generate(name, K, M, chunks=chunks, **kw)
    except ConfigError as exc:
        pytest.skip(f"{name} refuses K={K}, M={M}: {exc}")


@pytest.mark.parametrize("case", list(GOLDEN_CASES))
def test_golden_files(case):
    spec = dict(GOLDEN_CASES[case])
    text = schedules.generate(spec.pop("name"), 4, 4, **spec).to_text() + "\n"
    path = GOLDEN / f"{case}_K4_M4.txt"
    if os.environ.get("PIPESIM_REGEN_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing; create it with PIPESIM_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{case} changed; if intended, regenerate with PIPESIM_REGEN_GOLDEN=1"


def test_golden_text_reads_back():
    """The golden text is the schedule: parse it back into the same actions."""
    s = schedules.one_f_one_b(4, 4)
    lines = (GOLDEN / "1f1b_K4_M4.txt").read_text().splitlines()
    parsed = {int(d): tuple(Action.parse(t) for t in rest.split()) for d, rest in (ln.split(":") for ln in lines)}
    assert parsed == dict(s.actions)


@pytest.mark.parametrize("name", generators.names())
@pytest.mark.parametrize("K,M,N", [(1, 1, 1), (2, 3, 1), (4, 4, 2), (4, 8, 1), (5, 7, 2), (8, 16, 1)])
@pytest.mark.parametrize("recompute", [False, True])
def test_every_generator_gives_a_valid_schedule(name, K, M, N, recompute):
    """The checks of PyTorch's _validate_schedule, over every registered generator."""
    s = _generate(name, K, M, iterations=N, recompute=recompute)
    assert isinstance(s, Schedule) and s.validate() is s
    assert (s.devices, s.microbatches, s.iterations) == (K, M, N)
    assert s.stages % K == 0 and len(s.placement) == s.stages
    assert s.expected_actions() == set(s) and len(set(s)) == len(s)
    # every (stage, micro-batch): one F, one B, W only with a split backward, R iff recompute
    for stage in range(s.stages):
        for mb in range(M * N):
            assert (stage, mb) in s.recomputed or not recompute
    assert s.updates_per_stage >= N  # at least one optimizer step per stage and iteration
    # per device, F before (R before) B before W for each micro-batch
    for device, acts in s.actions.items():
        pos = {a: i for i, a in enumerate(acts)}
        for a in acts:
            assert s.device_of(a) == device
            if a.kind is ActionKind.B:
                assert pos[Action(a.stage, ActionKind.F, a.mb)] < pos[a]
                r = Action(a.stage, ActionKind.R, a.mb)
                if r in pos:
                    assert pos[Action(a.stage, ActionKind.F, a.mb)] < pos[r] < pos[a]
            if a.kind is ActionKind.W:
                assert pos[Action(a.stage, ActionKind.B, a.mb)] < pos[a]


@pytest.mark.parametrize("name", generators.names())
def test_generator_modules_document_themselves(name):
    gen = generators.get_generator(name)
    for attr in ("NAME", "SUMMARY", "SOURCE", "BUBBLE", "MEMORY"):
        assert isinstance(getattr(gen, attr), str) and getattr(gen, attr).strip(), f"{name}.{attr}"
    assert callable(gen.generate)
    assert gen.__doc__


@pytest.mark.parametrize("name", generators.names())
def test_chunks_attribute_is_honoured(name):
    """CHUNKS (default 1) is the chunks per device a generator places; 0 or None: any number."""
    declared = getattr(generators.get_generator(name), "CHUNKS", 1)
    for chunks in ([declared] if declared else [1, 2, 3]):
        K, M = 2, 4 * chunks
        s = schedules.generate(name, K, M, chunks=chunks)
        assert s.stages == K * chunks


def test_registry_names_and_lookup():
    assert {"naive", "gpipe", "1f1b", "pipedream"} <= set(generators.names())
    with pytest.raises(ValueError, match=r"unknown schedule 'zzz'; choose one of: .*gpipe.*1f1b"):
        generators.get_generator("zzz")
    with pytest.raises(ValueError, match="unknown schedule"):
        schedules.generate("zzz", 2, 2)


@pytest.mark.parametrize("kw", [dict(devices=0, microbatches=1), dict(devices=2, microbatches=0),
                                dict(devices=2, microbatches=2, iterations=0), dict(devices=2.0, microbatches=2),
                                dict(devices=True, microbatches=2)])
def test_bad_pipeline_config(kw):
    with pytest.raises(ConfigError, match="must be a positive integer"):
        PipelineConfig(**kw)


@pytest.mark.parametrize("recompute", ["yes", 1, None])
def test_a_recompute_that_is_not_a_bool_is_refused_before_any_generator_runs(recompute):
    """"yes" is truthy: unchecked it reached the generators and failed there with a bare TypeError."""
    with pytest.raises(ConfigError, match="recompute must be True or False"):
        schedules.generate("1f1b", 2, 4, recompute=recompute)
    assert schedules.generate("1f1b", 2, 4, recompute=np.bool_(True)) == schedules.generate("1f1b", 2, 4,
                                                                                            recompute=True)


def test_chunks_are_refused_by_single_stage_schedules():
    with pytest.raises(ConfigError, match="takes no --chunks"):
        schedules.generate("gpipe", 2, 2, chunks=2)


@pytest.mark.parametrize("K,M", [(4, 8), (4, 2), (1, 3)])
def test_1f1b_warmup_counts(K, M):
    """Stage s starts with min(K-s-1, M) forwards before its first backward (Megatron's warm-up)."""
    s = schedules.one_f_one_b(K, M)
    for d, acts in s.actions.items():
        first_b = next(i for i, a in enumerate(acts) if a.kind is ActionKind.B)
        assert first_b == min(K - d - 1, M) + (1 if M > K - d - 1 else 0)
        assert all(a.kind is ActionKind.F for a in acts[:first_b])


def test_gpipe_order():
    s = schedules.gpipe(2, 3)
    assert [str(a) for a in s.actions[0]] == ["0F0", "0F1", "0F2", "0B2", "0B1", "0B0", "0U0"]


def test_recompute_pass_puts_r_right_before_b():
    s = schedules.one_f_one_b(3, 4, recompute=True)
    assert s.name == "1f1b+recompute"
    for acts in s.actions.values():
        for i, a in enumerate(acts):
            if a.kind is ActionKind.B:
                assert acts[i - 1] == Action(a.stage, ActionKind.R, a.mb)
    from sim.core.passes import add_recompute
    assert add_recompute(s) is s  # idempotent


@pytest.mark.parametrize("K,M,N", [(1, 1, 1), (2, 3, 2), (3, 1, 1), (4, 7, 3), (5, 2, 2)])
def test_key_array_generators_match_their_action_orders(K, M, N):
    """gpipe, naive, 1f1b and pipedream build key arrays for every device at once; the per-stage Action orders
    (the readable definition) give the same schedule."""
    from sim.schedules.generators.gpipe import gpipe_order
    from sim.schedules.generators.naive import naive_order
    from sim.schedules.generators.one_f_one_b import one_f_one_b_order
    from sim.core.ir import Action, ActionKind

    for name, order in (("gpipe", gpipe_order), ("naive", naive_order),
                        ("1f1b", lambda d, mbs: one_f_one_b_order(d, K, mbs))):
        s = schedules.generate(name, K, M, iterations=N)
        expected = {d: [a for it in range(N) for a in order(d, range(it * M, (it + 1) * M)) + [Action(d, ActionKind.U, it)]]
                    for d in range(K)}
        assert {d: list(a) for d, a in s.actions.items()} == expected, name
    s = schedules.generate("pipedream", K, M, iterations=N)
    for d in range(K):
        expected = []
        for a in one_f_one_b_order(d, K, range(M * N)):
            expected += [a, Action(d, ActionKind.U, a.mb)] if a.kind is ActionKind.B else [a]
        assert list(s.actions[d]) == expected


def test_recompute_pass_on_arrays_matches_the_action_rule():
    from sim.core.ir import ActionKind

    for name in ("gpipe", "zb-h1", "zbv"):
        base = _generate(name, 3, 6)
        s = schedules.generate(name, 3, 6, recompute=True, chunks=2 if name == "zbv" else None)
        for d in range(3):
            expected = []
            for a in base.actions[d]:
                if a.kind is ActionKind.B:
                    expected.append(type(a)(a.stage, ActionKind.R, a.mb))
                expected.append(a)
            assert list(s.actions[d]) == expected


def test_generation_is_linear_in_devices():
    """Many devices, one micro-batch (issue 15.2: a K x S loop made K=100000 run for minutes)."""
    s = schedules.one_f_one_b(20_000, 1)
    assert len(s) == 3 * 20_000 and s.actions[19_999] == s.actions[19_999]


@pytest.mark.parametrize("K,v,mult,N", [(1, 2, 1, 1), (2, 2, 2, 2), (3, 3, 1, 1), (4, 2, 3, 2)])
def test_interleaved_key_grid_matches_megatrons_order(K, v, mult, N):
    from sim.schedules.generators.interleaved_1f1b import _virtual_order
    from sim.core.ir import Action, ActionKind

    M = K * mult
    s = schedules.interleaved_1f1b(K, M, chunks=v, iterations=N)
    for d in range(K):
        expected = [a for it in range(N) for a in _virtual_order(d, K, v, range(it * M, (it + 1) * M))
                    + [Action(st, ActionKind.U, it) for st in range(d, K * v, K)]]
        assert list(s.actions[d]) == expected


@pytest.mark.parametrize("K,M,N", [(1, 1, 1), (2, 3, 2), (3, 2, 1), (4, 4, 1), (4, 9, 2), (6, 5, 1)])
def test_zb_h1_key_grid_matches_its_order(K, M, N):
    from sim.schedules.generators.zb_h1 import zb_h1_order
    from sim.core.ir import Action, ActionKind

    s = schedules.zb_h1(K, M, iterations=N)
    for d in range(K):
        expected = [a for it in range(N) for a in zb_h1_order(d, K, range(it * M, (it + 1) * M))
                    + [Action(d, ActionKind.U, it)]]
        assert list(s.actions[d]) == expected
