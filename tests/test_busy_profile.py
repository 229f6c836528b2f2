"""Profiling that notices a busy machine (cope_core/profile/busy.py, issue 42 item 4): the decision
on hand-worked totals and samples, the meter's sums, the re-measurement and the refusal through
measure_profile and ``cope profile`` (slow: they profile a tiny model). Nothing here is timed: the
totals are made up or patched."""
from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tiny import tiny_geometry, tiny_trace

from cope_core import parquet_io
from cope_core.cli.main import main
from cope_core.errors import CopeInputError
from cope_core.mechanisms import StopRule
from cope_core.profile import busy, measure
from cope_core.profile.busy import (
    NOISE_LIMIT_PCT,
    OTHERS_LIMIT,
    WAIT_LIMIT,
    BusyMachineError,
    SharedQuality,
    WaitMeter,
    judge,
    prefer,
)

S = 1_000_000_000          # one second in ns
QUIET_ROWS = {"a": [100.0, 100.0, 100.0, 110.0, 90.0]}      # MAD 0 -> noise floor 0 %


def test_busy_needs_both_the_wait_and_other_processes():
    # 1 s of shared samples on 2 CPUs: 0.2 s waiting for a CPU, others used 1.2 CPU-seconds
    q = judge(S, S // 5, 6 * S // 5, 2, QUIET_ROWS, (5.0, 6.0))
    assert (q.wait_share, q.others_share, q.noise_pct) == (0.2, 0.6, 0.0)
    assert q.busy
    # the same wait with nothing else running: this process's own wake-ups, not a busy machine
    assert not judge(S, S // 5, S // 100, 2, QUIET_ROWS, (0.1, 0.1)).busy
    # others ran, but the profiler hardly waited (a free core): 4 % is within the 5 % limit
    assert not judge(S, 4 * S // 100, 18 * S // 10, 2, QUIET_ROWS, (2.0, 2.0)).busy


def test_the_limits_are_strict():
    at = judge(100, 5, 10, 2, QUIET_ROWS, (None, None))          # 5 % wait, 5 % of 2 CPUs
    assert (at.wait_share, at.others_share) == (WAIT_LIMIT, OTHERS_LIMIT) and not at.busy
    assert judge(100, 6, 12, 2, QUIET_ROWS, (None, None)).busy


def test_without_scheduler_statistics_the_spread_decides():
    # [100, 80, 120, 100, 130]: median 100, |dev| 0 20 20 0 30 -> MAD 20 -> 1.4826*20 % = 29.652 %
    wide = [100.0, 80.0, 120.0, 100.0, 130.0]
    q = judge(S, None, None, 2, {"wide": wide, "flat": QUIET_ROWS["a"], "short": [1.0, 9.0]},
              (None, None))
    # median of the rows' floors (29.652, 0; the 2-sample row has none) = 14.826 > 10
    assert q.noise_pct == pytest.approx(14.826) and q.noise_pct > NOISE_LIMIT_PCT and q.busy
    assert "scattered by 14.8 %" in q.reason()
    q = judge(S, None, None, 2, {"wide": wide, "f1": QUIET_ROWS["a"], "f2": QUIET_ROWS["a"]},
              (None, None))
    assert q.noise_pct == 0.0 and not q.busy                     # median of 29.652, 0, 0
    # with the statistics, a spread alone does not refuse (a tiny model scatters when quiet)
    assert not judge(S, 0, 0, 2, {"wide": wide}, (None, None)).busy


def test_the_refusal_is_one_line_naming_the_cause():
    q = judge(S, S // 5, 6 * S // 5, 2, QUIET_ROWS, (5.12, 6.3), attempts=3)
    err = BusyMachineError(q.reason())
    assert isinstance(err, CopeInputError)
    text = str(err)
    assert "\n" not in text
    assert text == ("the machine was busy while profiling (its threads waited for a CPU 20 % of "
                    "the time they timed shared work (summed over threads; limit 5 %) while other "
                    "processes used 60 % of the 2 CPUs (limit 5 %); spread 0.0 %; load average "
                    "5.12 -> 6.3, after 3 attempts): close other work and profile again, or keep "
                    "it with --busy-ok (its quality is recorded)")


def test_prefer_keeps_the_quietest_attempt():
    busy_a = judge(S, S // 5, S, 2, QUIET_ROWS, (None, None))
    busy_b = judge(S, S // 10, S, 2, QUIET_ROWS, (None, None))
    quiet = judge(S, S // 5, 0, 2, QUIET_ROWS, (None, None))
    assert prefer(busy_a, None)
    assert prefer(busy_b, busy_a) and not prefer(busy_a, busy_b)       # smaller wait
    assert prefer(quiet, busy_b) and not prefer(busy_b, quiet)          # quiet beats busy
    assert not prefer(busy_a, busy_a)                                   # a tie keeps the old


@given(w=st.integers(0, S), dw=st.integers(0, S), o=st.integers(0, 4 * S),
       do=st.integers(0, 4 * S), cpus=st.integers(1, 64))
def test_more_waiting_or_more_other_work_never_makes_a_busy_machine_quiet(w, dw, o, do, cpus):
    before = judge(S, w, o, cpus, QUIET_ROWS, (None, None))
    after = judge(S, w + dw, o + do, cpus, QUIET_ROWS, (None, None))
    assert after.busy or not before.busy
    assert not prefer(after, before)            # nor is the busier attempt kept over the other


def test_the_meter_sums_around_each_sample(monkeypatch):
    waits, machine = iter([10, 40, 100, 100]), iter([1_000, 5_000, 9_000, 9_500])
    clock, cpu = iter([0, 700, 1_000, 1_300]), iter([0, 600, 0, 200])
    monkeypatch.setattr(busy, "run_queue_wait_ns", lambda: next(waits))
    monkeypatch.setattr(busy, "machine_busy_ns", lambda: next(machine))
    monkeypatch.setattr(busy.time, "perf_counter_ns", lambda: next(clock))
    monkeypatch.setattr(busy.time, "process_time_ns", lambda: next(cpu))
    m = WaitMeter()
    sample = m.wrap(lambda: 7.0)
    assert sample() == 7.0 and sample() == 7.0
    # wall 700 + 300; wait 30 + 0; others (4000 - 600) + (500 - 200)
    assert (m.wall_ns, m.wait_ns, m.others_ns) == (1_000, 30, 3_700)


def test_the_meter_says_none_without_scheduler_statistics(monkeypatch):
    monkeypatch.setattr(busy, "run_queue_wait_ns", lambda: None)
    m = WaitMeter()
    m.wrap(lambda: 1.0)()
    assert m.wait_ns is None and m.wall_ns > 0


def test_the_readers_count_up():
    a, b = busy.run_queue_wait_ns(), busy.machine_busy_ns()
    sum(range(100_000))
    if a is None or b is None:
        pytest.skip("no /proc scheduler statistics on this OS")
    assert 0 <= a <= busy.run_queue_wait_ns() and 0 <= b <= busy.machine_busy_ns()


# --- through the profiler -------------------------------------------------------------------------
G = tiny_geometry()
QUICK = StopRule(warmup=0, min_samples=3, max_samples=3, batch=1, max_seconds=0.5)


def _always(busy_now: bool, calls: list):
    def fake(wall, wait, others, cpus, rows, load, attempts=1):
        calls.append(attempts)
        assert set(rows) and all(k.startswith("ProfileKey(kind='shared'") for k in rows)
        return SharedQuality(0.5 if busy_now else 0.0, 0.9, 1.0, load, cpus, attempts)
    return fake


@pytest.mark.slow
@pytest.mark.parametrize("refuse", [True, False])
def test_a_busy_point_is_measured_again_then_refused_or_recorded(monkeypatch, refuse):
    calls: list = []
    monkeypatch.setattr(measure, "judge", _always(True, calls))
    settings = measure.ProfilerSettings(cpu_threads=(1,), contexts=(16,), rule=QUICK,
                                        shared_rule=QUICK, attempts=3, refuse_busy=refuse)
    if refuse:
        with pytest.raises(BusyMachineError, match=r"waited for a CPU 50 % .* after 3 attempts"):
            measure.measure_profile(G, settings, progress=False)
        assert calls == [1, 2, 3]
        return
    prof, _, _ = measure.measure_profile(G, settings, progress=False)
    assert calls == [1, 2, 3]
    (q,) = prof.platform["shared_quality"]
    assert q["busy"] and q["attempts"] == 3 and q["cpu_threads"] == 1
    assert "BUSY machine at CPU threads [1]" in prof.notes


@pytest.mark.slow
def test_a_quiet_point_is_measured_once(monkeypatch):
    calls: list = []
    monkeypatch.setattr(measure, "judge", _always(False, calls))
    settings = measure.ProfilerSettings(cpu_threads=(1,), contexts=(16,), rule=QUICK,
                                        shared_rule=QUICK, attempts=3, refuse_busy=True)
    prof, _, _ = measure.measure_profile(G, settings, progress=False)
    assert calls == [1] and not prof.platform["shared_quality"][0]["busy"]
    assert "BUSY" not in prof.notes


@pytest.mark.slow
def test_cope_profile_refuses_a_busy_machine_unless_told(monkeypatch, tmp_path, capsys):
    calls: list = []
    monkeypatch.setattr(measure, "judge", _always(True, calls))
    t = tmp_path / "t.parquet"
    parquet_io.write_trace(tiny_trace(), t)
    args = ["profile", "--trace", str(t), "--threads", "1", "--contexts", "16",
            "--max-samples", "3", "--min-time", "0", "--no-progress", "-o", str(tmp_path / "p")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the machine was busy while profiling" in err
    assert calls == [1, 2, 3] and not (tmp_path / "p").exists()
    assert main([*args, "--busy-ok"]) == 0
    prof = parquet_io.read_profile(tmp_path / "p")
    assert prof.platform["shared_quality"][0]["busy"] is True
    capsys.readouterr()
    assert main(["predict", "--trace", str(t), "--profile", str(tmp_path / "p"), "-K", "2",
                 "--draws", "0"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {tmp_path / 'p'}: profiled on a busy machine at CPU threads [1]" in err


def test_busy_note_names_the_busy_points_only():
    quiet = {**judge(S, 0, 0, 2, QUIET_ROWS, (0.5, 0.5)).to_dict(), "cpu_threads": 1}
    loud = {**judge(S, S // 2, S, 2, QUIET_ROWS, (4.0, 4.0)).to_dict(), "cpu_threads": 2}
    assert busy.busy_note({"shared_quality": [quiet]}) is None
    assert busy.busy_note({}) is None and busy.busy_note({"shared_quality": "x"}) is None
    assert busy.busy_note({"shared_quality": [quiet, loud]}) == (
        "profiled on a busy machine at CPU threads [2] (its threads waited for a CPU 50 % of the "
        "time they timed shared work (summed over threads; limit 5 %) while other processes used "
        "50 % of the 2 CPUs (limit 5 %); spread 0.0 %; load average 4 -> 4): its timings are "
        "inflated; profile again on a quiet machine")
    # a malformed record still warns, without the numbers
    assert busy.busy_note({"shared_quality": [{"busy": True, "cpu_threads": 3}]}) == (
        "profiled on a busy machine at CPU threads [3]: its timings are inflated; profile again "
        "on a quiet machine")


def test_quality_round_trips_as_json():
    q = dataclasses.replace(judge(S, S // 5, S, 2, QUIET_ROWS, (1.5, None)), attempts=2)
    d = q.to_dict()
    assert d == {"wait_share": 0.2, "others_share": 0.5, "noise_pct": 0.0, "load": [1.5, None],
                 "cpus": 2, "attempts": 2, "busy": True}
    assert math.isfinite(d["wait_share"])
    assert SharedQuality.from_dict({**d, "cpu_threads": 4}) == q
