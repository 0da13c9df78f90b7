"""The benchmark harness (benchmarks/_common.py, run_all.py, compare.py) on fake timings: the interleaving order,
the repeat floor, medians and quartiles against numpy, the record format and compare's noise rule."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import _common  # noqa: E402
import compare  # noqa: E402


class FakeClock:
    """A clock that only advances when a method "runs": each method adds its scripted duration."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def scripted(clock, calls, name, durations):
    it = iter(durations)

    def fn():
        calls.append(name)
        clock.now += next(it)

    return fn


def test_interleaved_rotates_the_order_every_round_and_times_each_call():
    clock, calls = FakeClock(), []
    methods = {k: scripted(clock, calls, k, d) for k, d in
               {"a": [9, 1, 2, 3], "b": [9, 10, 20, 30], "c": [9, 100, 200, 300]}.items()}
    times = _common.interleaved(methods, repeats=3, warmup=1, clock=clock)
    assert calls == ["a", "b", "c",  # warm-up, untimed
                     "a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert times == {"a": [1, 2, 3], "b": [10, 20, 30], "c": [100, 200, 300]}


def test_budget_never_stops_before_the_repeat_floor():
    clock, calls = FakeClock(), []
    methods = {"a": scripted(clock, calls, "a", [1.0] * 20), "b": scripted(clock, calls, "b", [1.0] * 20)}
    times = _common.interleaved(methods, repeats=10, warmup=0, budget=0.0, clock=clock)
    assert len(times["a"]) == len(times["b"]) == _common.MIN_REPEATS
    times = _common.interleaved({"a": lambda: None}, repeats=3, warmup=0, budget=0.0, clock=clock)
    assert len(times["a"]) == 3  # asked for fewer than the floor: that many


def test_sync_is_called_around_every_timed_call():
    events = []
    _common.interleaved({"a": lambda: events.append("run")}, repeats=2, warmup=0,
                        sync=lambda: events.append("sync"))
    assert events == ["sync", "run", "sync"] * 2


def test_after_runs_untimed_after_every_call_warm_up_included():
    clock, calls = FakeClock(), []
    methods = {k: scripted(clock, calls, k, d) for k, d in {"a": [9, 1, 2], "b": [9, 10, 20]}.items()}

    def after(name):
        calls.append(f"after {name}")
        clock.now += 1000  # cleaning up takes long: none of it may be timed

    times = _common.interleaved(methods, repeats=2, warmup=1, clock=clock, after=after)
    assert calls == ["a", "after a", "b", "after b",  # warm-up
                     "a", "after a", "b", "after b", "b", "after b", "a", "after a"]
    assert times == {"a": [1, 2], "b": [10, 20]}


def test_the_recorder_benchmark_runs_in_its_quick_mode(tmp_path, monkeypatch, capsys):
    """The recorder benchmark's code at toy size (one round, nothing measured): every figure recorded."""
    import recorder

    path = tmp_path / "r.jsonl"
    monkeypatch.setenv(_common.RECORDS_ENV, str(path))
    assert recorder.main(["--quick"]) == 0
    figures = [json.loads(line) for line in path.read_text().splitlines()]
    names = [f["figure"] for f in figures]
    for writer in ("inline", "thread"):
        assert any(f"Recorder {writer}: loop + a checkpoint per epoch" in n for n in names)
        assert any(f"per-save cost, Recorder {writer}: save: ms per MiB" in n for n in names)
    assert all(np.isfinite(f["value"]) for f in figures)  # one noisy round: a fitted slope may come out negative
    assert all(f["value"] > 0 for f in figures if "loop + a checkpoint" in f["figure"])
    assert "torch.save + fsync" in capsys.readouterr().out


@pytest.mark.parametrize("samples", [[3.0], [1.0, 2.0], [5.0, 1.0, 4.0, 2.0, 3.0], [0.56, 1.21, 1.58, 0.57, 0.9, 2.4]])
def test_spread_matches_numpy(samples):
    s = _common.spread(samples)
    q1, med, q3 = np.percentile(samples, [25, 50, 75])
    assert s == pytest.approx({"median": med, "min": min(samples), "max": max(samples), "q1": q1, "q3": q3,
                               "repeats": len(samples)})
    assert s["median"] == pytest.approx(np.median(samples))


def test_ratios_pair_rounds():
    assert _common.ratios({"ours": [1.0, 2.0, 3.0], "peer": [2.0, 2.0, 6.0]}, "ours", "peer") == [0.5, 1.0, 0.5]


def test_record_writes_the_median_and_its_spread(tmp_path, monkeypatch, capsys):
    path = tmp_path / "r.jsonl"
    monkeypatch.setenv(_common.RECORDS_ENV, str(path))
    _common.record("f", samples=[0.5, 0.4, 0.7, 0.6, 0.55], goal=0.6, better="lower")
    _common.record("g", samples=[2.0, 3.0], goal=1.0)
    _common.record("h", 1.5)
    a, b, c = (json.loads(line) for line in path.read_text().splitlines())
    assert a["value"] == 0.55 and a["met"] is True and a["repeats"] == 5
    assert a["spread"] == pytest.approx({"min": 0.4, "max": 0.7, "q1": 0.5, "q3": 0.6})
    assert a["samples"] == [0.5, 0.4, 0.7, 0.6, 0.55] and a["device"] == "cpu"
    assert "fewer than 5 repeats" in b["note"] and b["value"] == 2.5
    assert "spread" not in c and c["value"] == 1.5
    out = capsys.readouterr().out
    assert "median of 5, range 0.4-0.7, IQR 0.5-0.6" in out


def test_cpu_info_reads_model_and_isa_flags():
    text = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\nflags\t\t: fpu sse4_2 avx avx2 fma "
            "avx512f avx512bw amx_tile\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8488C\n")
    info = _common.cpu_info(text)
    assert info == {"model": "Intel(R) Xeon(R) Platinum 8488C",
                    "isa": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "amx_tile"]}


def test_machine_info_names_what_a_record_needs():
    info = _common.machine_info()
    for key in ("cpu", "torch_cpu_capability", "cores", "usable_cores", "loadavg", "torch", "numpy", "torch_threads",
                "thread_env", "cuda"):
        assert key in info
    json.dumps(info)


def fig(value, lo=None, hi=None, better="higher"):
    f = {"figure": "x", "value": value, "goal": None, "better": better, "unit": "x", "met": None, "note": ""}
    if lo is not None:
        f["spread"] = {"min": lo, "max": hi, "q1": lo, "q3": hi}
    return f


@pytest.mark.parametrize(("old", "new", "verdict"), [
    (fig(1.0, 0.8, 1.3), fig(1.2, 1.1, 1.4), "noise"),          # new median inside old range
    (fig(1.0, 0.9, 1.1), fig(1.25, 0.95, 1.5), "noise"),        # old median inside new range
    (fig(1.0, 0.9, 1.1), fig(1.5, 1.3, 1.6), "better"),         # a speed-up that rose beyond both ranges
    (fig(1.0, 0.9, 1.1, "lower"), fig(1.5, 1.3, 1.6, "lower"), "worse"),  # a time ratio that rose
    (fig(1.0, 0.9, 1.1, "lower"), fig(0.5, 0.4, 0.6, "lower"), "better"),
    (fig(1.0), fig(1.5, 1.3, 1.6), "better"),                   # only the new record has a spread
    (fig(1.0), fig(1.5, 0.9, 1.6), "noise"),
    (fig(1.0, 0.9, 1.1), fig(0.95), "noise"),                   # only the old one has
    (fig(1.0), fig(2.0), "unjudged"),                           # records before spreads were recorded
])
def test_compare_noise_rule(old, new, verdict):
    assert compare.judge(old, new) == verdict


def test_compare_reads_old_records_and_new_ones(tmp_path):
    old_records = sorted((BENCH / "results").glob("*.json"))
    assert old_records, "the committed records"
    old = compare.load(str(old_records[0]))
    new = {"commit": "n", "date": "d", "machine": {"cpu": {"model": "M", "isa": ["avx2"]}},
           "figures": [{**f, "value": f["value"] * 2, "spread": {"min": f["value"] * 1.9, "max": f["value"] * 2.1,
                                                                  "q1": f["value"] * 1.95, "q3": f["value"] * 2.05}}
                       for f in old["figures"]]}
    lines = compare.compare(old, new)
    assert any("better" in line or "worse" in line for line in lines)
    assert "on M [avx2]" in lines[1]
    other = {**new, "machine": {"cpu": {"model": "Other", "isa": []}}}
    lines = compare.compare(new, other)
    assert any("other machine" in line for line in lines[3:])
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    assert compare.main([str(old_records[0]), str(path)]) == 0
    with pytest.raises(SystemExit, match="not a benchmark record"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        compare.load(str(bad))


# ------------------------------------------------------------------------------------------ GPU variants

def test_gpu_benchmark_code_runs_on_the_cpu_at_toy_size(tmp_path, monkeypatch):
    import gpu

    path = tmp_path / "r.jsonl"
    monkeypatch.setenv(_common.RECORDS_ENV, str(path))
    assert gpu.main(["--device", "cpu", "--small", "--repeats", "1"]) == 0
    figures = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(figures) == 6  # per-sample norms and grads, DP step x plain and x Opacus, interpolation, NTK
    assert all(f["device"] == "cpu" and f["figure"].startswith("CPU check") for f in figures)
    assert all(f["value"] > 0 for f in figures)


@pytest.mark.skipif(_common.machine_info()["cuda"] is not None, reason="a GPU is present")
def test_gpu_benchmark_without_cuda_says_so_and_succeeds(capsys):
    import gpu

    assert gpu.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.cuda
def test_gpu_benchmark_measures_time_and_peak_memory_on_cuda(tmp_path, monkeypatch, capsys):
    import gpu

    path = tmp_path / "r.jsonl"
    monkeypatch.setenv(_common.RECORDS_ENV, str(path))
    assert gpu.main(["--small", "--repeats", "1"]) == 0
    figures = [json.loads(line) for line in path.read_text().splitlines()]
    assert figures and all(f["device"] == "cuda" and f["figure"].startswith("GPU") for f in figures)
    assert " nan" not in capsys.readouterr().out  # every method's peak memory was measured


def test_run_all_writes_one_record_with_machine_and_spreads(tmp_path, monkeypatch, capsys):
    import run_all

    monkeypatch.setenv(run_all.RESULTS_ENV, str(tmp_path))
    code = run_all.main(["directions", "--", "--n", "2", "--steps", "2", "--grid", "3"])
    assert code == 0
    (path,) = tmp_path.glob("*.json")
    rec = compare.load(str(path))
    assert rec["format"] == 2 and rec["benchmarks"] == ["directions"]
    assert rec["machine"]["cpu"]["model"] and rec["machine"]["thread_env"]["OMP_NUM_THREADS"] == "1"
    assert len(rec["figures"]) == 2
    for f in rec["figures"]:
        assert f["repeats"] == _common.MIN_REPEATS and f["spread"]["min"] <= f["value"] <= f["spread"]["max"]
    assert rec["machine"]["torch_threads"] == 1
    capsys.readouterr()
    assert compare.main([str(path), str(path)]) == 0
    assert "noise" in capsys.readouterr().out
    assert run_all.main(["nonsense"]) == 2


def test_forward_flops_count_lenets_multiply_adds_as_the_closed_form():
    """LeNet on 1x8x8 digits: conv 1 (6 maps of 8x8, 25 taps), conv 2 (16 maps of 4x4, 6x25 taps), then linear
    64-120-84-10: 9,600 + 38,400 + 18,600 multiply-adds per example, two FLOPs each (what directions.py and
    interpolate.py read their rates against)."""
    import torch

    from landscape.models import build_model

    model = build_model("lenet", input_shape=(1, 8, 8), num_classes=10).eval()
    per_example = 64 * 6 * 25 + 16 * 16 * 6 * 25 + (64 * 120 + 120 * 84 + 84 * 10)
    assert _common.forward_flops(model, torch.zeros(7, 1, 8, 8)) == 2 * 7 * per_example == 2 * 7 * 66_600
    assert _common.matmul_peak(n=64, repeats=3) > 0
