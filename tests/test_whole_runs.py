"""Whole runs as the unit of machine-level numbers, CIs that do not turn on a seed, the code registration
and the run ledger (issue: verdicts that survive the next run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from studylib.bench.stats import (
    N_RESAMPLES,
    bootstrap_interval,
    estimate,
    ratio_estimate,
    run_estimate,
)
from studylib.bench.whole_runs import WholeRuns, run_one, whole_runs
from studylib.claims import HOLDS, INCONCLUSIVE, judge_at_least
from studylib.errors import StudylibError

# ---------------------------------------------------------------------------------------- the CIs

def test_bca_uses_ten_thousand_resamples_and_reports_its_monte_carlo_error():
    x = np.random.default_rng(3).lognormal(0, 0.2, 15)
    lo, hi, mc = bootstrap_interval(x)
    assert N_RESAMPLES >= 10_000 and lo < np.median(x) < hi and 0 < mc < (hi - lo) / 5
    e = estimate(x)
    assert e.mc_error == pytest.approx(mc) and e.method.startswith("BCa") and e.confidence == 0.95


def test_bca_bounds_move_with_the_seed_by_about_their_monte_carlo_error():
    x = np.random.default_rng(4).normal(1.0, 0.1, 30)
    bounds = np.array([bootstrap_interval(x, statistic=np.mean, seed=s)[:2] for s in range(8)])
    mc = np.median([bootstrap_interval(x, statistic=np.mean, seed=s)[2] for s in range(8)])
    assert bounds.std(axis=0).max() < 4 * mc


def test_bca_corrects_a_skewed_statistic_where_the_percentile_interval_does_not():
    # the mean of an exponential sample: BCa moves the interval up, towards the long tail
    x = np.random.default_rng(5).exponential(1.0, 25)
    lo, hi, _ = bootstrap_interval(x, statistic=np.mean)
    idx = np.random.default_rng(0).integers(0, x.size, (N_RESAMPLES, x.size))
    plo, phi = np.percentile(x[idx].mean(axis=1), [2.5, 97.5])
    assert hi > phi and lo > plo


def test_ratio_estimate_is_bca_with_its_error():
    b = np.random.default_rng(6).lognormal(0, 0.1, 12)
    e = ratio_estimate(b * 1.2, b)
    assert e.value == pytest.approx(1.2) and e.mc_error >= 0 and e.method.startswith("BCa")


def test_run_estimate_is_t_on_logs_and_says_so():
    e = run_estimate([0.46, 0.55, 0.48, 0.50, 0.47])
    logs = np.log([0.46, 0.55, 0.48, 0.50, 0.47])
    from scipy import stats

    half = stats.t.ppf(0.975, 4) * logs.std(ddof=1) / np.sqrt(5)
    assert e.value == pytest.approx(np.exp(logs.mean()))
    assert (e.ci_low, e.ci_high) == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)))
    assert e.n == 5 and "4 df" in e.method and e.mc_error > 0  # the bounds' run-to-run error
    # the issue's five runs of the bandwidth fraction straddle 0.5: a rerun can no longer flip them
    row = judge_at_least("C2", "fraction", e, 0.5, "", "", 1, unit="whole runs")
    assert row.verdict == INCONCLUSIVE and row.ci_method.startswith("t on the log")
    with pytest.raises(ValueError):
        run_estimate([0.5, -1.0])
    assert np.isnan(run_estimate([0.5]).ci_low)


def test_a_wider_spread_between_runs_widens_the_ci_a_prompt_level_ci_never_sees():
    tight, spread = run_estimate([0.55, 0.551, 0.549, 0.55, 0.552]), run_estimate([0.51, 0.59, 0.53, 0.57, 0.55])
    assert judge_at_least("C1", "s", tight, 0.5, "", "", 1, unit="whole runs").verdict == HOLDS
    assert spread.ci_high - spread.ci_low > 10 * (tight.ci_high - tight.ci_low)


# ---------------------------------------------------------------------------------------- whole runs

def _fake_section(scale: float, bandwidth_gbs: float, run_index: int = 0, run_count: int = 1, **_) -> dict:
    """A timing section for the tests: reports its pid (each run must be its own process) and its place."""
    return {"value": scale * (1 + run_index), "pid": os.getpid(), "place": run_index, "of": run_count,
            "bandwidth": bandwidth_gbs}


def test_every_whole_run_is_a_fresh_process_with_its_own_probe_and_load(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    runs = whole_runs("test_whole_runs:_fake_section", {"scale": 2.0, "probe_mbytes": 8}, runs=3, progress=False)
    pids = [r["metrics"]["pid"] for r in runs.runs]
    assert len(set(pids)) == 3 and os.getpid() not in pids
    assert runs.values("value") == [2.0, 4.0, 6.0] and [r["metrics"]["of"] for r in runs.runs] == [3, 3, 3]
    assert all(r["bandwidth_gbs"] > 0 and len(r["load_before"]) == 3 for r in runs.runs)
    assert runs.estimate("value").n == 3 and len(runs.table()) == 3
    json.dumps(runs.to_dict())  # the record goes into the chapter's JSON


def test_a_failing_run_names_itself(monkeypatch):
    with pytest.raises(StudylibError, match="whole run 1 of studylib.nothing:here failed"):
        whole_runs("studylib.nothing:here", {}, runs=2, progress=False)
    with pytest.raises(StudylibError, match="at least 2 runs"):
        whole_runs("x:y", {}, runs=1, progress=False)


def test_a_metric_missing_from_a_run_is_an_error_that_names_it():
    runs = WholeRuns("t:f", {}, [{"metrics": {"a": 1.0}}, {"metrics": {"b": 1.0}}])
    with pytest.raises(StudylibError, match="returned no 'a'"):
        runs.values("a")
    assert runs.metrics() == []


def test_run_one_measures_the_bandwidth_before_the_section(monkeypatch):
    rec = run_one("test_whole_runs:_fake_section", {"scale": 1.0, "probe_mbytes": 8})
    assert rec["metrics"]["bandwidth"] == rec["bandwidth_gbs"] > 0 and rec["pid"] == os.getpid()


# ---------------------------------------------------------------------------------------- registration of code

def test_the_fingerprint_covers_the_measuring_modules_and_kernels_not_the_pages():
    from studylib.code_registration import fingerprint

    fp = fingerprint(1, {"a": 1})
    files = fp["files"]
    assert "studylib/experiments/ch01_formats.py" in files and "studylib/bench/whole_runs.py" in files
    assert "studylib/claims.py" in files and "studylib/models/csrc/quant_linear.c" in files
    assert "notebooks/01_autoregressive_baseline.ipynb" in files
    assert not any(f.startswith("studylib/workbook/") or f.endswith("_figures.py") for f in files)
    assert fingerprint(1, {"a": 2})["params"] != fp["params"] and fingerprint(1, {"a": 1})["code"] == fp["code"]
    assert fingerprint(1, {"a": 1, "out_dir": "/x"})["params"] == fp["params"]


def test_lazy_imports_inside_functions_count():
    from studylib.code_registration import closure

    # ch01_formats imports studylib.models.weights only inside a function
    assert "studylib.models.weights" in closure(["studylib.experiments.ch01_formats"])


def test_modules_imported_by_name_count():
    import ast

    from studylib.code_registration import _imports, closure

    # quant.act_kernel imports the int8 and bf16 kernels' modules by name (importlib), and provenance
    # reads the kernel registry the same way: all three define what a chapter measures
    found = closure(["studylib.models.quant", "studylib.bench.provenance"])
    for m in ("studylib.models.int8_linear", "studylib.models.bf16_linear", "studylib.models.kernels"):
        assert m in found, m
    # a string is a module only when it is spelled like one; closure then keeps studylib's modules
    assert _imports(ast.parse('x = "studylib.models.quant"; y = "studylib is fast"; z = "numpy.linalg"'),
                    "") == {"studylib.models.quant"}


def test_a_change_to_the_code_after_registration_makes_the_result_exploratory(tmp_path):
    from studylib.code_registration import check_result, differences, fingerprint

    reg = fingerprint(3, {"p": 1})
    changed = dict(reg, files=dict(reg["files"], **{"studylib/bench/stats.py": "0" * 64}), code="x")
    assert differences(changed, reg) == ["code changed after registration (studylib/bench/stats.py)"]
    assert differences(dict(reg, params="y"), reg) == ["parameters differ from the registered profile"]
    assert differences(reg, reg) == []
    registry = tmp_path / "registered_code.json"
    registry.write_text(json.dumps({"cpu": {"ch03": reg}}))
    record = {"chapter": 3, "params": {"profile": "cpu"}, "code_fingerprint": changed,
              "provenance": {"git_commit": "abc"}}
    assert "code changed after registration" in check_result(record, registry)
    assert "no code fingerprint" in check_result(dict(record, code_fingerprint=None), registry)
    assert "no code registration for profile smoke" in check_result(dict(record, params={"profile": "smoke"}),
                                                                    registry)
    # an uncommitted registry cannot register anything
    assert "uncommitted" in check_result(dict(record, code_fingerprint=reg), registry)


def test_register_and_check_from_the_command_line(tmp_path, monkeypatch):
    from studylib import code_registration as cr
    from studylib.workbook import register_cli

    monkeypatch.setattr(cr, "REGISTRY", tmp_path / "registered_code.json")
    params = register_cli.profile_params("smoke", [3])
    cr.write("smoke", params)
    assert register_cli.stale_chapters("smoke", [3]) == {}
    assert "no code registration" in register_cli.stale_chapters("smoke", [4])[4][0]


def test_the_committed_registry_parses_and_names_every_chapter():
    from studylib.code_registration import read_registry
    from studylib.workbook.runner import discover

    reg = read_registry()
    chapters = {f"ch{c:02d}" for c in discover(os.path.join(os.path.dirname(__file__), "..", "notebooks"))}
    assert chapters <= set(reg.get("cpu", {})), "run `studylib register --profile cpu` and commit it"


# ---------------------------------------------------------------------------------------- the ledger

def _record(chapter=1, verdict="holds", code="c1", cpu="Xeon", commit="a" * 40, dirty=False):
    return {"chapter": chapter, "params": {"profile": "cpu"}, "written": "2026-12-06T00:00:00+00:00",
            "code_fingerprint": {"code": code, "params": "p"},
            "provenance": {"git_commit": commit, "git_dirty": dirty, "cpu": cpu, "load_average_1min": 0.5},
            "verdicts": [{"id": "C1", "role": "decision", "metric": "m", "measured": "1/1", "ci": None, "n": None,
                          "verdict": verdict, "by_construction": False},
                         {"id": "C1", "role": "part", "metric": "p", "measured": 0.6, "ci": [0.55, 0.65], "n": 5,
                          "unit": "whole runs", "verdict": verdict, "by_construction": False},
                         {"id": "C1", "role": "part", "metric": "r2", "measured": 0.99, "ci": None, "n": 10,
                          "verdict": "holds", "by_construction": True}]}


def test_the_ledger_appends_and_never_rewrites(tmp_path):
    from studylib import ledger

    path = tmp_path / "ledger.jsonl"
    ledger.append(_record(), path)
    first = path.read_text()
    ledger.append(_record(verdict="inconclusive"), path)
    assert path.read_text().startswith(first) and len(ledger.read(path)) == 2
    line = ledger.read(path)[0]
    assert line["code"] == "c1" and line["cpu"] == "Xeon" and [r["metric"] for r in line["rows"]] == ["m", "p"]


def test_the_ledger_shows_runs_of_the_same_code_and_cpu_and_names_disagreements(tmp_path):
    from studylib import ledger

    path = tmp_path / "ledger.jsonl"
    for rec in (_record(), _record(verdict="inconclusive"), _record(code="old", verdict="does not hold"),
                _record(cpu="EPYC", verdict="does not hold"), _record(dirty=True, verdict="does not hold")):
        ledger.append(rec, path)
    same = ledger.same_code(ledger.read(path), 1, "c1", "Xeon", "cpu")
    assert len(same) == 2
    assert ledger.disagreements(same) == {"C1": ["holds", "inconclusive"]}
    text = ledger.summary(_record(), path)
    assert "2 runs" in text and "C1: holds, inconclusive" in text
    assert ledger.summary(_record(code="new"), path) == ""


def test_reproduce_into_a_committed_folder_appends_to_the_ledger():
    from studylib.workbook import runner

    src = open(runner.__file__, encoding="utf-8").read()
    assert "ledger.append(" in src and "ledger_on = committed_reports(out)" in src


# ---------------------------------------------------------------------------------------- one-way rules

def test_the_declarations_do_not_import_the_rules():
    import ast

    from studylib.code_registration import PACKAGE

    for mod in ("decisions.py", "verdict.py", "code_registration.py", "git_history.py"):
        tree = ast.parse((PACKAGE / mod).read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "studylib.claims" not in names, f"{mod} imports the rules"
    out = subprocess.run([sys.executable, "-c", "import studylib.decisions, sys; print('studylib.claims' in sys.modules)"],
                         capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------- C3's speed-ups

def _summary3(speed=(1.2, 1.1, 1.3), prompts=10):
    import pandas as pd

    rows = []
    for w in ("chat", "xsum", "humaneval"):
        for m in ("ar", "lookahead:1,4,2+prompt"):
            v, lo, hi = (1.0, 1.0, 1.0) if m == "ar" else speed
            rows.append({"workload": w, "method": m, "prompts": prompts, "compression": 1.0 if m == "ar" else 1.5,
                         "compression_lo": 1.0 if m == "ar" else 1.3, "compression_hi": 1.0 if m == "ar" else 1.7,
                         "speedup": v, "speedup_lo": lo, "speedup_hi": hi, "exact": True})
    return pd.DataFrame(rows)


def _speed_runs(value, spread=0.01, n=5, temps=None):
    rng = np.random.default_rng(1)
    keys = [f"speedup:{w}" for w in ("chat", "xsum", "humaneval")] if temps is None else [
        f"speedup:T{t}:{w}" for t in temps for w in ("chat", "xsum", "humaneval")]
    return WholeRuns("t:f", {}, [{"metrics": {k: value * (1 + spread * rng.standard_normal()) for k in keys}}
                                 for _ in range(n)])


def test_chapter_3_judges_its_speed_up_over_whole_runs():
    from studylib import decisions
    from studylib.experiments import ch03_jacobi_lookahead as ch03

    summary, m = _summary3(), "lookahead:1,4,2+prompt"
    # a speed-up whose prompt-level CI clears 1 but whose runs spread across it: inconclusive, not holds
    spread = WholeRuns("t:f", {}, [{"metrics": {f"speedup:{w}": v for w in ("chat", "xsum", "humaneval")}}
                                   for v in (0.96, 1.08, 0.99, 1.05, 1.01)])
    rows = ch03.c3_verdicts(summary, m, speed_runs=ch03.speed_over_runs(spread, summary, m))
    speed = next(r for r in rows if r.metric.startswith("wall-clock"))
    assert speed.unit == "whole runs" and speed.n == 5 and speed.verdict == INCONCLUSIVE
    assert "shown, not deciding" in speed.conditions
    ok = ch03.c3_verdicts(summary, m, speed_runs=ch03.speed_over_runs(_speed_runs(1.6), summary, m))
    assert ok[0].verdict == HOLDS and len(decisions.stamp(ok, 3)) == len(ok)
    # the prompt-level CI alone counts no repeats
    assert ch03.c3_verdicts(summary, m)[0].verdict == INCONCLUSIVE


def test_chapter_2_judges_both_temperatures_over_whole_runs():
    import pandas as pd

    from studylib import decisions
    from studylib.claims import FAILS
    from studylib.experiments import ch02_speculative as ch02

    head = "eagle@5,4,16"
    rows = []
    for w in ("chat", "xsum", "humaneval"):
        for m in ("ar", head):
            rows.append({"workload": w, "method": m, "prompts": 10, "speedup": 0.5 if m != "ar" else 1.0,
                         "speedup_lo": 0.45, "speedup_hi": 0.55, "tokens_per_step": 2.0, "tokens_per_step_lo": 1.8,
                         "tokens_per_step_hi": 2.2, "exact_match": 1.0})
    by = pd.DataFrame(rows)
    runs = _speed_runs(0.5, temps=("0", "1"))
    out = ch02.c3_verdicts(by, head, None, "greedy", t1=by, runs=runs)
    speed = [r for r in out if r.metric.startswith("wall-clock")]
    assert [r.metric[-3:] for r in speed] == ["T=0", "T=1"]
    assert all(r.unit == "whole runs" and r.n == 5 and r.verdict == FAILS for r in speed)
    assert len(decisions.stamp(out, 2)) == len(out)


# ------------------------------------------------------------------------------ between-session drift

def test_the_declared_between_session_sd_widens_a_whole_run_ci_in_quadrature():
    from scipy import stats as st

    vals = [1.01, 1.02, 1.03, 1.02, 1.02]
    bare, wide = run_estimate(vals), run_estimate(vals, session_sd=0.03)
    logs = np.log(vals)
    within = st.t.ppf(0.975, 4) * logs.std(ddof=1) / np.sqrt(5)
    half = np.hypot(within, st.norm.ppf(0.975) * 0.03)
    assert wide.value == pytest.approx(bare.value)
    assert np.log(wide.ci_high / wide.value) == pytest.approx(half) and wide.ci_low < bare.ci_low
    assert "drift sd of 0.03 between cold runs" in wide.method and wide.method.startswith("t on the log")
    with pytest.raises(ValueError):
        run_estimate(vals, session_sd=-0.1)


def test_a_speed_up_near_its_bar_reads_inconclusive_in_every_session_not_holds_in_one():
    # two sessions of the same code: chapter 3's lookahead at 0.985 and at 1.020, each tight within its
    # session; with the drift no session's CI clears the bar of 1, and neither misses it
    for level in (0.985, 1.020):
        runs = WholeRuns("t:x", {}, [{"metrics": {"speedup:xsum": level * f}} for f in
                                    (0.995, 1.0, 1.005, 0.998, 1.002)])
        row = judge_at_least("C3", "s", runs.estimate("speedup:xsum"), 1.0, "", "", 3, unit="whole runs")
        assert row.verdict == INCONCLUSIVE, (level, row.ci)
    # a number well clear of its bar still decides
    far = WholeRuns("t:x", {}, [{"metrics": {"speedup:xsum": 1.6 * f}} for f in (0.99, 1.0, 1.01, 0.995, 1.005)])
    assert judge_at_least("C3", "s", far.estimate("speedup:xsum"), 1.0, "", "", 3, unit="whole runs").verdict == HOLDS


def test_numbers_against_the_machine_and_arm_against_arm_take_their_own_declarations():
    from studylib.bench import session_drift as sd

    assert sd.kind_of("bandwidth_fraction:gguf") == sd.kind_of("bytes_share") == sd.VS_MACHINE
    assert sd.kind_of("speedup:T0:chat") == sd.kind_of("gain:continuous/static") == sd.ARM_VS_ARM
    assert sd.sd_between("bandwidth_fraction:gguf", 1) == sd.DECLARED[(1, sd.VS_MACHINE)]
    assert sd.sd_between("speedup:a", 6) == sd.DECLARED[(6, sd.ARM_VS_ARM)]
    # chapter 1 declares only numbers against the machine, chapter 6 only speed-ups: the other kind in either
    # chapter takes that kind's widest declaration
    assert sd.sd_between("speedup:a", 1) == max(v for k, v in sd.DECLARED.items() if k[1] == sd.ARM_VS_ARM)
    runs = WholeRuns("studylib.experiments.ch01_formats:t", {},
                     [{"metrics": {"bandwidth_fraction:gguf": 0.5 * f}} for f in (0.99, 1.0, 1.01, 0.995, 1.005)])
    six = WholeRuns("studylib.experiments.ch06_decode:t", {},
                    [{"metrics": {"speedup:a": 0.5 * f}} for f in (0.99, 1.0, 1.01, 0.995, 1.005)])
    a, b = runs.estimate("bandwidth_fraction:gguf"), six.estimate("speedup:a")
    assert a.ci_high - a.ci_low > b.ci_high - b.ci_low


def test_the_declared_drift_is_what_the_ledger_gave_before_it_was_declared():
    # the declaration is derived, not chosen: the ledger's sessions up to AS_OF, rounded up
    from studylib import ledger
    from studylib.bench import session_drift as sd

    est = sd.estimate_from_ledger(ledger.read())
    assert sd.declared_from(est) == sd.DECLARED
    assert all(sd.DECLARED[k] >= v["sd"] for k, v in est.items())
    assert {k: v["df"] for k, v in est.items()} == sd.DECLARED_DF  # and the df its quantile takes


def test_a_drift_seen_in_few_sessions_widens_more_than_one_seen_in_many():
    from studylib.bench.stats import run_estimate

    vals = [1.0, 1.01, 0.99, 1.005, 0.995]
    few, many, z = (run_estimate(vals, session_sd=0.05, session_df=df) for df in (2, 60, None))
    assert few.ci_high - few.ci_low > many.ci_high - many.ci_low > z.ci_high - z.ci_low
    assert "t on its 2 df" in few.method
    with pytest.raises(ValueError, match="session_df"):
        run_estimate(vals, session_sd=0.05, session_df=0)


def test_the_drift_is_pooled_over_cold_runs_of_one_code_per_chapter_and_kind():
    from studylib.bench import session_drift as sd

    def line(chapter, code, commit, written, c1, c3):
        return {"chapter": chapter, "profile": "cpu", "code": code, "commit": commit, "written": written, "rows": [
            {"id": "C1", "metric": "share", "measured": c1, "unit": "whole runs"},
            {"id": "C3", "metric": "speed", "measured": c3, "unit": "whole runs"},
            {"id": "C3", "metric": "tokens", "measured": 9.0, "unit": "prompts"}]}

    lines = [line(1, "k", "a", "2026-01-01", 0.5, 1.0),
             line(1, "k", "a", "2026-01-02", 0.5 * np.e ** 0.2, 1.0 * np.e ** 0.02),  # a rerun of one commit counts
             line(1, "other", "b", "2026-01-03", 5.0, 9.0),  # other code: never drift, whatever it reads
             line(2, "m", "c", "2026-01-04", 0.5, 1.0), line(2, "m", "d", "2026-01-05", 0.5, 1.0 * np.e ** 0.1),
             line(1, "k", "e", "2030-01-01", 9.0, 9.0)]  # written after AS_OF: never feeds the declaration
    est = sd.estimate_from_ledger(lines, as_of="2026-12-31")
    assert est[(1, sd.VS_MACHINE)]["sd"] == pytest.approx(0.2 / np.sqrt(2)) and est[(1, sd.VS_MACHINE)]["df"] == 1
    assert est[(1, sd.ARM_VS_ARM)]["sd"] == pytest.approx(0.02 / np.sqrt(2))
    assert est[(2, sd.ARM_VS_ARM)]["sd"] == pytest.approx(0.1 / np.sqrt(2))  # each chapter its own
    assert est[(2, sd.VS_MACHINE)]["sd"] == 0.0


def test_each_chapter_is_widened_by_its_own_drift_and_an_undeclared_one_by_the_widest():
    from studylib.bench import session_drift as sd

    assert sd.chapter_of("studylib.experiments.ch08_compression:timing_run") == 8
    assert sd.chapter_of("studylib.bench.ar_bench:x") is None
    assert sd.sd_between("speedup:q8_0", 8) == sd.DECLARED[(8, sd.ARM_VS_ARM)]
    assert sd.df_between("speedup:q8_0", 8) == sd.DECLARED_DF[(8, sd.ARM_VS_ARM)]
    widest = max(v for (_, kind), v in sd.DECLARED.items() if kind == sd.ARM_VS_ARM)
    fewest = min(v for (_, kind), v in sd.DECLARED_DF.items() if kind == sd.ARM_VS_ARM)
    assert sd.sd_between("speedup:x", None) == widest and sd.df_between("speedup:x", 99) == fewest
    vals = [{"metrics": {"speedup:a": 2.0 * f}} for f in (0.99, 1.0, 1.01, 0.995, 1.005)]
    six = WholeRuns("studylib.experiments.ch06_decode:t", {}, vals).estimate("speedup:a")
    eight = WholeRuns("studylib.experiments.ch08_compression:t", {}, vals).estimate("speedup:a")
    assert sd.DECLARED[(6, sd.ARM_VS_ARM)] < sd.DECLARED[(8, sd.ARM_VS_ARM)]
    assert eight.ci_high - eight.ci_low > six.ci_high - six.ci_low


def test_a_run_bound_within_its_own_run_to_run_error_of_the_bar_neither_clears_nor_misses():
    """Two sets of five runs of one commit put chapter 1's bandwidth fraction at 0.4304 [0.3738, 0.4955] and
    0.4316 [0.3723, 0.5003] against a bar of 0.5: one missed, one straddled. A bound moves between sets of
    runs by its own standard error, which counts as its Monte Carlo error: within it of the bar, neither."""
    from studylib.bench.stats import run_estimate
    from studylib.claims import FAILS, INCONCLUSIVE, judge_at_least

    runs = [0.4209, 0.4383, 0.4266, 0.4345, 0.4319]
    e = run_estimate(runs, session_sd=0.06, session_df=8)
    assert 0 < e.mc_error < 0.1 * e.ci_high and "run-to-run error" in e.method

    def verdict(bar):
        return judge_at_least("C2", "f", e, bar, "", "", 1, unit="whole runs").verdict

    assert verdict(e.ci_high + 0.5 * e.mc_error) == INCONCLUSIVE  # missed by less than the bound's own error
    assert verdict(e.ci_high + 2 * e.mc_error) == FAILS  # missed by more: a miss in any set of runs


def test_rows_of_one_run_add_no_degrees_of_freedom_to_the_drift():
    """Two rows measured in the same three cold runs of one code pool their spread, but the sd rests on three
    runs: two degrees of freedom, not four (one machine draw moves every number measured in it)."""
    from studylib.bench import session_drift as sd

    lines = [{"chapter": 1, "profile": "cpu", "code": "k", "commit": c, "written": f"2026-01-0{i}", "rows": [
        {"id": "C1", "metric": "share", "measured": 0.5 * (1 + 0.05 * i), "unit": "whole runs"},
        {"id": "C2", "metric": "fraction", "measured": 0.4 * (1 - 0.04 * i), "unit": "whole runs"}]}
        for i, c in enumerate("abc", 1)]
    est = sd.estimate_from_ledger(lines, as_of="2026-12-31")
    assert est[(1, sd.VS_MACHINE)]["df"] == 2


def test_a_row_that_drifts_more_than_its_chapter_sets_the_chapter_drift_once_it_has_enough_pairs():
    """Chapter 8's gguf@int8 row drifts more than q4_1's, and the pool averages them away. A row seen in
    MIN_ROW_DF or more same-code pairs that drifts more than its chapter's pool declares the chapter's sd, on its
    own df; a row seen in fewer pairs leaves the pool alone (its sd is too rough to pick out the worst row), and a
    noisy row of the other kind, or of another chapter, never sets this one."""
    from studylib.bench import session_drift as sd

    def lines(pairs, steady_only=3):
        out = []
        for g in range(pairs + steady_only):
            for j, f in enumerate((1.0, np.e ** 0.2)):  # per cold-run pair: one noisy row, one steady row
                rows = [{"id": "C9", "metric": "steady", "measured": 3.0 * f ** 0.05, "unit": "whole runs"}]
                if g < pairs:  # the noisy row repeats in only some of the pairs
                    rows.append({"id": "C9", "metric": "noisy", "measured": 2.0 * f, "unit": "whole runs"})
                out.append({"chapter": 8, "profile": "cpu", "code": f"k{g}", "commit": f"c{g}{j}",
                            "written": "2026-01-01", "rows": rows})
                # a far noisier number against the machine, and another chapter's speed-up: other pools
                out.append({"chapter": 1, "profile": "cpu", "code": f"m{g}", "commit": f"d{g}{j}",
                            "written": "2026-01-01", "rows": [
                                {"id": "C2", "metric": "fraction", "measured": 0.5 * f ** 3, "unit": "whole runs"},
                                {"id": "C3", "metric": "other", "measured": 0.5 * f ** 2, "unit": "whole runs"}]})
        return out

    m = sd.MIN_ROW_DF
    enough = sd.estimate_from_ledger(lines(m), as_of="2026-12-31")
    eight = enough[(8, sd.ARM_VS_ARM)]
    assert eight["sd"] == pytest.approx(0.2 / np.sqrt(2)) and eight["row"] == "C9: noisy"
    assert eight["df"] == m  # the row's own pairs, not the chapter's m + 3
    assert enough[(1, sd.VS_MACHINE)]["sd"] == pytest.approx(0.6 / np.sqrt(2))  # its own pool, not chapter 8's
    few = sd.estimate_from_ledger(lines(m - 1), as_of="2026-12-31")[(8, sd.ARM_VS_ARM)]
    # both rows' squared deviations over both rows' df: (m - 1) noisy pairs, (m + 2) steady ones
    pooled = np.sqrt(((m - 1) * 0.2 ** 2 / 2 + (m + 2) * 0.01 ** 2 / 2) / (2 * m + 1))
    assert few["sd"] == pytest.approx(pooled) and few["row"] is None and few["df"] == m + 2
    assert few["sd"] < eight["sd"]


def test_a_corrected_level_takes_enough_resamples_for_its_tail():
    from studylib.bench.stats import bca_bounds, resamples_for

    assert resamples_for(0.95) == 10_000 and resamples_for(0.9975) >= 80_000
    # a bound asked of fewer than MIN_TAIL resamples is unresolved: its error is the interval's width
    x = np.random.default_rng(1).standard_normal(12)
    boots = np.array([np.median(np.random.default_rng(i).choice(x, x.size)) for i in range(400)])
    jack = np.array([np.median(np.delete(x, i)) for i in range(x.size)])
    lo, hi, mc = bca_bounds(float(np.median(x)), boots, jack, 0.9975)
    assert mc >= hi - lo
    lo, hi, mc = bca_bounds(float(np.median(x)), boots, jack, 0.80)
    assert mc < hi - lo


def test_a_chapter_that_judges_on_another_chapters_results_hashes_that_chapters_code():
    """Chapter 7 judges C7 on chapter 5's throughput and latency under load: ch05_load defines its metric."""
    from studylib.code_registration import fingerprint

    seven = fingerprint(7, None)["files"]
    assert "studylib/experiments/ch05_load.py" in seven and "notebooks/05_dynamic_batching.ipynb" in seven
    assert "studylib/experiments/ch07_report.py" not in fingerprint(5, None)["files"]


def test_two_cold_runs_of_one_code_read_the_same_verdict_under_the_declared_drift():
    """Two cold runs of one code put C9's q8_0 speed-up at 2.80 and 2.71 (five runs each, within 1.7% of each
    other) against a bar of 2. Counting only the within-run error, the first held and the second did not. The
    declared drift of chapter 8 is part of how far a bound moves, so the two runs must read alike: a
    declaration that put its edge between them (sd 0.06 on 9 df pooled across commits did) fails here."""
    from studylib.bench import session_drift as sd
    from studylib.claims import judge_at_least

    target = "studylib.experiments.ch08_compression:timing_run"
    spread = (0.985, 1.0, 1.015, 0.99, 1.01)

    def judged(level):
        runs = WholeRuns(target, {}, [{"metrics": {"speedup:q8_0": level * f}} for f in spread])
        e = runs.estimate("speedup:q8_0", confidence=0.99375)
        assert e.mc_error > e.ci_high * sd.DECLARED[(8, sd.ARM_VS_ARM)] * 0.9  # the drift is in the bound's error
        return judge_at_least("C9", "s", e, 2.0, "", "", 8, unit="whole runs").verdict

    assert judged(2.80) == judged(2.71)
    assert judged(2.2) != "holds" and judged(3.8) == "holds"  # near the bar it does not hold; far above, it does


def test_a_ratio_over_few_units_is_never_narrower_than_its_t_interval(monkeypatch):
    """A referee recomputed chapter 6's next-word ratios over 10 documents: BCa cleared 0.99 by 0.0025 where
    a t interval crossed it. Below SMALL_N units the bootstrap under-covers, so each bound is the wider of
    the two; from SMALL_N units on, BCa alone."""
    from studylib.bench import stats as st

    rng = np.random.default_rng(3)
    den = rng.integers(80, 120, size=10).astype(float)
    num = den * rng.normal(1.0, 0.02, size=10)
    lo, hi, _ = st.ratio_of_sums_bounds(num, den, 0.99)
    t_lo, t_hi = st.ratio_t_bounds(num, den, 0.99)
    assert lo <= t_lo and hi >= t_hi and lo < hi
    # the t interval is the ratio estimator's: R = 1, residuals -1 and 1, se = 1 / mean(den) = 0.5
    assert st.ratio_t_bounds([1.0, 3.0], [2.0, 2.0], 0.95) == pytest.approx((1 - 12.7062047 * 0.5, 1 + 12.7062047 * 0.5))
    # a t interval wider than anything shows where it applies: below SMALL_N units, and only there
    monkeypatch.setattr(st, "ratio_t_bounds", lambda a, b, c: (-99.0, 99.0))
    assert st.ratio_of_sums_bounds(num, den, 0.99)[:2] == (-99.0, 99.0)
    big_den = rng.integers(80, 120, size=st.SMALL_N).astype(float)
    big = st.ratio_of_sums_bounds(big_den * rng.normal(1.0, 0.02, size=st.SMALL_N), big_den, 0.99)
    assert -99.0 < big[0] < big[1] < 99.0


def test_every_few_unit_ci_follows_the_same_small_n_rule():
    """A referee found the small-n rule applied to ratios of sums only: chapter 2's tokens per forward and
    chapter 7's under-load ratio (10 traces) kept plain BCa. Below SMALL_N units a median, a mean and a paired
    ratio are each widened to an interval that does not estimate its own corrections from the few units."""
    from scipy import stats as sps

    from studylib.bench import stats as st

    # the median's order-statistic interval: at n = 10 and 95% it is (x_(2), x_(9)), coverage 1 - 2 P(B <= 1)
    lo, hi, cov = st.median_order_bounds(np.arange(10.0), 0.95)
    assert (lo, hi) == (1.0, 8.0) and cov == pytest.approx(1 - 2 * sps.binom.cdf(1, 10, 0.5))
    assert st.median_order_bounds(np.arange(10.0), 0.99)[:2] == (0.0, 9.0)  # (x_(2), x_(9)) covers 97.9% only
    rng = np.random.default_rng(5)
    few = rng.lognormal(0.0, 0.3, size=10)
    e = st.estimate(few)
    o_lo, o_hi, _ = st.median_order_bounds(few, 0.95)
    assert e.ci_low <= o_lo and e.ci_high >= o_hi and "order-statistic" in e.method
    m = st.estimate(few, np.mean)
    t_lo, t_hi, _ = st.mean_t_bounds(few, 0.95)
    assert m.ci_low <= t_lo and m.ci_high >= t_hi and "t interval" in m.method
    base, treated = rng.lognormal(0.5, 0.2, size=10), rng.lognormal(0.0, 0.2, size=10)
    r = st.ratio_estimate(base, treated)
    p_lo, p_hi, _ = st.median_order_bounds(base / treated, 0.95)
    assert r.ci_low <= p_lo and r.ci_high >= p_hi and "paired ratios" in r.method
    # at five units no order statistic reaches 95% (min..max covers 93.75%): the CI says so and decides nothing
    five = st.estimate(few[:5])
    assert "93.8%" in five.method and five.mc_error >= five.ci_high - five.ci_low
    # from SMALL_N units on, BCa alone
    many = rng.lognormal(0.0, 0.3, size=st.SMALL_N)
    assert st.estimate(many).method == st.BCA and st.estimate(many, np.mean).method == st.BCA
    assert st.ratio_estimate(many, many[::-1]).method == st.BCA


def test_one_slow_run_in_ten_does_not_carry_a_speed_up_far_from_its_bar_across_it():
    """The registered pair of 1c452e0 put C9's q8_0 at 3.74 and 3.23 over five runs each; the second had one
    slow run (its five 2.96-3.83), and t on 4 df at the 8-format level (5.3) turned that run into an
    inconclusive row under the drift then declared. Chapter 8 now takes ten whole runs (cpu.yaml): the same
    spread, twice over, puts the bound (less its error) well above the five runs'. Under the drift declared
    since, 3.23 no longer clears 2x whatever the runs; a format read at 4.5x with the same spread holds."""
    import yaml

    from studylib.claims import HOLDS, judge_at_least

    target = "studylib.experiments.ch08_compression:timing_run"
    spread = (0.92, 1.0, 1.03, 1.02, 1.19)  # 2.96-3.83 around 3.23
    five = WholeRuns(target, {}, [{"metrics": {"speedup:q8_0": 3.23 * f}} for f in spread])
    ten = WholeRuns(target, {}, [{"metrics": {"speedup:q8_0": 3.23 * f}} for f in spread * 2])
    e5, e10 = (r.estimate("speedup:q8_0", confidence=0.99375) for r in (five, ten))
    assert e10.ci_low - e10.mc_error > e5.ci_low - e5.mc_error + 0.1
    # under the drift declared since (chapter 8's most-drifting row, 0.09 on 7 df) 3.23 no longer clears 2 by its
    # bound's error; a format read at 4.5x with the same spread does
    far = WholeRuns(target, {}, [{"metrics": {"speedup:q8_0": 4.5 * f}} for f in spread * 2])
    assert judge_at_least("C9", "s", far.estimate("speedup:q8_0", confidence=0.99375), 2.0, "", "", 8,
                          unit="whole runs").verdict == HOLDS
    profile = yaml.safe_load((Path(__file__).resolve().parents[1] / "notebooks/params/cpu.yaml").read_text())
    assert profile["ch08"]["timing_runs"] >= 10
