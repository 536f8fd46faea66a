"""Sub-analyses below MIN_UNITS are illustrations: no CI, a caption with n, and no sentence concluding from them."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from studylib.claims import MIN_UNITS
from studylib.workbook import illustration as ill
from studylib.workbook.tables import CAPTION_KEY, to_html

N = MIN_UNITS["prompts"]  # 10
# Words by which a sentence picks a winner or explains a result; none may appear beside an illustration.
CONCLUDING = re.compile(r"\b(best|fastest|peaks?|closer|because|faster than|slower than|beats?|so the|"
                        r"explains?|differ:|cannot see|keeps every page)\b", re.IGNORECASE)


def _summary() -> pd.DataFrame:
    return pd.DataFrame({"method": ["a", "b"], "prompts": [2, 2], "speedup": [1.1, 0.9], "speedup_lo": [0.8, 0.7],
                         "speedup_hi": [1.4, 1.1], "tau_low": [1.0, 1.0], "tau_high": [2.0, 2.0], "lo": [0.5, 0.5],
                         "hi": [1.5, 1.5], "ci": ["[0.8, 1.4]", "[0.7, 1.1]"], "speedup [95% CI]": ["x", "y"],
                         "alpha": [0.5, 0.4], "high_water_mib": [1.0, 2.0]})


# ------------------------------------------------------------------------------------------- the helper


def test_illustration_drops_ci_columns_and_sets_the_caption():
    df = _summary()
    out = ill.illustration(df, 2, "prompts")
    assert list(out.columns) == ["method", "prompts", "speedup", "alpha", "high_water_mib"]
    assert out.attrs[CAPTION_KEY] == "Illustration (n = 2 prompts): too few to conclude; no CI is shown"
    assert out.attrs[ill.ILLUSTRATION_KEY] == {"n": 2, "unit": "prompts", "per": ""}
    assert "speedup_lo" in df.columns and CAPTION_KEY not in df.attrs  # the input is not modified
    html = to_html(out)
    assert "Illustration (n = 2 prompts): too few to conclude; no CI is shown" in html and "95% CI" not in html
    assert ill.illustration(df, 1).attrs[CAPTION_KEY].startswith("Illustration (n = 1 prompt)")


def test_enough_units_leave_the_frame_alone():
    df = _summary()
    out = ill.illustration(df, N, "prompts")
    assert out is df and list(out.columns) == list(_summary().columns) and not out.attrs
    assert "95% CI" in to_html(out) and "Illustration" not in to_html(out)
    assert ill.illustration(df, MIN_UNITS["whole runs"], "repeats") is df


@pytest.mark.parametrize(("n", "unit", "expected"), [
    (N - 1, "prompts", True), (N, "prompts", False), (2, "trials", True), (N, "trials", False),
    (MIN_UNITS["whole runs"] - 1, "repeats", True), (MIN_UNITS["whole runs"], "repeats", False), (9, "documents", True),
])
def test_is_illustration_reads_min_units(n, unit, expected):
    assert ill.is_illustration(n, unit) is expected


def test_unknown_unit_raises():
    with pytest.raises(ValueError, match="unknown unit"):
        ill.is_illustration(3, "tokens")  # steps inside one run are not units


def test_figure_titles_name_n():
    assert ill.title("Speedup", 2) == "Speedup (illustration, n = 2 prompts)"
    assert ill.title("Speedup", N) == "Speedup"
    assert ill.title("Needle", 1, "trials", per="cell") == "Needle (illustration, n = 1 trial per cell)"
    labelled = ill.illustration(_summary(), 3)
    assert ill.title_for("Speedup", labelled) == "Speedup (illustration, n = 3 prompts)"
    assert ill.title_for("Speedup", _summary()) == "Speedup"
    assert ill.title_for("Speedup", labelled.round(2)) == "Speedup (illustration, n = 3 prompts)"  # survives round


def test_sentence():
    assert ill.sentence(2) == "an illustration on n = 2 prompts; too few to conclude"


# ------------------------------------------------------------------------------------------- chapter 2


def _gamma_sweep(n: int) -> pd.DataFrame:
    df = pd.DataFrame({"gamma": [1, 2, 4], "prompts": n, "alpha": [0.5, 0.5, 0.5], "tokens_per_step": [1.4, 1.7, 1.9],
                       "theory_tokens_per_step": [1.5, 1.75, 1.94], "c": 0.2, "v": [1.1, 1.3, 1.6],
                       "predicted_speedup_leviathan": [1.2, 1.2, 1.07], "predicted_speedup_measured_v": [1.0, 1.0, 0.9],
                       "speedup": [0.95, 1.02, 0.9], "speedup_lo": [0.9, 0.97, 0.85], "speedup_hi": [1.0, 1.07, 0.95]})
    return ill.illustration(df, n)


def test_gamma_sweep_prose_does_not_conclude_below_n():
    from studylib.experiments.ch02_speculative import explain_sweep

    text = explain_sweep(_gamma_sweep(1))
    assert "an illustration on n = 1 prompt; too few to conclude" in text
    assert not CONCLUDING.search(text), text
    full = explain_sweep(_gamma_sweep(N))  # the same numbers on enough prompts do conclude
    assert CONCLUDING.search(full) and "illustration" not in full


def _peers(n: int) -> pd.DataFrame:
    df = pd.DataFrame({"ours": ["ar", "pld@8,3"], "peer": ["hf:ar", "hf:pld@8,3"], "prompts": n,
                       "ours_over_peer": [1.8, 1.5], "lo": [1.7, 1.3], "hi": [1.9, 1.6]})
    return ill.illustration(df, n)


def _by_workload() -> pd.DataFrame:
    return pd.DataFrame({"workload": ["xsum", "chat"], "method": ["pld@8,3", "sps:distilled@4"], "prompts": [N, N],
                         "speedup": [1.4, 0.6], "speedup_lo": [1.0, 0.5], "speedup_hi": [1.6, 0.7]})


def test_peer_aims_below_n_are_not_judged():
    from studylib.experiments.ch02_speculative import explain_aims, performance_aim

    aims = performance_aim(_by_workload(), "pld@8,3", "sps:distilled@4", _peers(2))
    peer_rows = aims[aims.aim.str.contains("faster than hf")]
    assert len(peer_rows) == 2 and peer_rows.met.isna().all()
    assert (peer_rows.ci == "illustration (n = 2 prompts)").all()
    html = to_html(aims)
    assert "illustration (n = 2 prompts)" in html and "not judged" in html
    text = explain_aims(aims, _gamma_sweep(1))
    assert text.startswith("0 of 2 of this chapter's performance targets met.") and "2 more are not judged" in text
    assert "gamma sweep" not in text  # the sweep on one prompt explains nothing
    none = performance_aim(_by_workload().assign(prompts=2), "pld@8,3", "sps:distilled@4", _peers(2))
    assert none.met.isna().all() and explain_aims(none).startswith("No aim is judged: all 4 are illustrations")
    judged = performance_aim(_by_workload(), "pld@8,3", "sps:distilled@4", _peers(N))
    assert judged.met.tolist() == [False, False, True, True]
    assert "gamma sweep" in explain_aims(judged, _gamma_sweep(N))


def test_eagle_aims_below_n_are_not_judged():
    from studylib.experiments.ch02_eagle import eagle_aims

    bw = pd.DataFrame([{"workload": "chat", "method": "eagle@5,4,16", "prompts": 2, "tokens_per_step": 2.7,
                        "tokens_per_step_lo": 2.6, "tokens_per_step_hi": 2.8, "speedup": 1.6, "speedup_lo": 1.55,
                        "speedup_hi": 1.8}])
    aims = eagle_aims(bw, "eagle@5,4,16")
    assert aims.met.isna().all() and (aims.ci == "illustration (n = 2 prompts)").all()
    assert eagle_aims(bw.assign(prompts=N), "eagle@5,4,16").met.tolist() == [True, True]


def test_hf_peer_summary_is_an_illustration_on_two_prompts():
    from studylib.experiments.ch02_peers import hf_peer_summary

    rows = []
    for i, p in enumerate(["p1", "p2"]):
        for cfg, s in (("ar", 1.0), ("hf:ar", 2.0), ("sps:distilled:full@4", 1.5), ("hf:assisted@4", 3.0),
                       ("pld@8,3", 0.9), ("hf:pld@8,3", 1.2)):
            rows.append({"prompt": p, "config": cfg, "s_per_token": s * (1 + 0.1 * i), "equal_to_our_ar": True})
    out = hf_peer_summary(pd.DataFrame(rows), 4, 3, 8)
    assert (out.prompts == 2).all() and not {"lo", "hi"} & set(out.columns)
    assert out.attrs[CAPTION_KEY].startswith("Illustration (n = 2 prompts)")


def test_tree_prose_and_depth_table_below_n():
    from studylib.experiments.ch02_eagle import acceptance_by_depth, explain_trees

    trees = pd.DataFrame({"method": ["eagle@3", "eagle@4,2,6"], "shape": ["chain", "tree"], "verify_tokens": [4, 4],
                          "prompts": 2, "tau": [1.4, 1.5], "tau_lo": [1.3, 1.3], "tau_hi": [1.5, 1.7], "v": [1.6, 2.1],
                          "speedup": [0.76, 0.63], "speedup_lo": [0.73, 0.6], "speedup_hi": [0.78, 0.65]})
    text = explain_trees(ill.illustration(trees, 2))
    assert "an illustration on n = 2 prompts; too few to conclude" in text and not CONCLUDING.search(text), text
    assert CONCLUDING.search(explain_trees(trees.assign(prompts=N)))
    pos = ill.illustration(pd.DataFrame({"method": ["eagle@3"] * 2, "depth": [1, 2], "acceptance": [0.4, 0.3]}), 2)
    assert acceptance_by_depth(pos).attrs[CAPTION_KEY].startswith("Illustration (n = 2 prompts)")


def test_greedy_prose_below_n_names_no_best_method():
    from studylib.experiments.ch02_speculative import explain_greedy

    bw = pd.DataFrame({"workload": ["chat"] * 3, "method": ["ar", "pld@8,3", "sps:distilled@4"], "prompts": 2,
                       "speedup": [1.0, 1.3, 0.8], "speedup_lo": [1.0, 1.1, 0.7], "speedup_hi": [1.0, 1.5, 0.9],
                       "tokens_per_step": [1.0, 1.6, 1.2], "exact_match": 1.0})
    text = explain_greedy(bw, "pld@8,3", "pld@8,3")
    assert "an illustration on n = 2 prompts; too few to conclude" in text and not CONCLUDING.search(text), text
    assert "best method" in explain_greedy(bw.assign(prompts=N), "pld@8,3", "pld@8,3")


def test_specbench_per_category_columns_are_labelled():
    from studylib.experiments.ch02_speculative import specbench_table

    rows = [{"prompt": f"{c}{i}", "category": c, "method": m, "s_per_token": s * (1 + 0.05 * i), "tokens_per_step": t,
             "accepted": 1, "rejections": 1, "proposed": 2, "equal_to_ar": True, "mean_gamma": 0.0}
            for c in ("qa", "code") for i in range(2) for m, s, t in (("ar", 1.0, 1.0), ("pld@8,3", 0.8, 1.5))]
    cap = specbench_table(pd.DataFrame(rows)).attrs[CAPTION_KEY]
    assert "illustrations (n = 2 prompts each)" in cap and "4 prompts" in cap


# ------------------------------------------------------------------------------------------- chapter 3


def _la_sweep(n: int) -> pd.DataFrame:
    df = pd.DataFrame({"method": ["lookahead:1,3,1+prompt", "lookahead:4,5,3+prompt"], "prompts": n,
                       "compression": [1.2, 1.7], "compression_lo": [1.1, 1.3], "compression_hi": [1.3, 2.2],
                       "speedup": [0.85, 0.62], "speedup_lo": [0.83, 0.52], "speedup_hi": [0.87, 0.74],
                       "tokens_per_forward": [4.1, 19.8], "W": [1, 4], "N": [3, 5], "G": [1, 3]})
    return ill.illustration(df, n)


def test_lookahead_sweep_prose_and_titles_below_n():
    import matplotlib.pyplot as plt

    from studylib.experiments.ch03_figures import explain_sweep, plot_sweep

    text = explain_sweep(_la_sweep(2))
    assert "an illustration on n = 2 prompts; too few to conclude" in text and not CONCLUDING.search(text), text
    assert "best wall clock" in explain_sweep(_la_sweep(N))
    fig = plot_sweep(_la_sweep(2), "speedup")
    assert all(" ".join(ax.get_title().split()).endswith("(illustration, n = 2 prompts)")  # tidy may wrap a title
               for ax in fig.axes if ax.get_title())
    plt.close(fig)


def test_headline_prose_below_n_does_not_conclude():
    from studylib.experiments.ch03_figures import explain_speed

    s = pd.DataFrame({"workload": ["xsum", "humaneval"], "method": "lookahead:1,4,2+prompt", "prompts": 2,
                      "compression": [1.3, 1.5], "speedup": [1.2, 0.8], "speedup_lo": [1.1, 0.7],
                      "speedup_hi": [1.3, 0.9], "exact": True})
    text = explain_speed(s, "lookahead:1,4,2+prompt")
    assert "an illustration on n = 2 prompts per workload; too few to conclude" in text and not CONCLUDING.search(text), text
    assert "faster than AR" in explain_speed(s.assign(prompts=N), "lookahead:1,4,2+prompt")


def test_lookahead_aim_below_n_is_not_judged():
    from studylib.experiments.ch03_jacobi_lookahead import performance_aim

    s = pd.DataFrame({"workload": ["xsum", "humaneval"], "method": "la", "prompts": [2, N], "speedup": [1.5, 1.5],
                      "speedup_lo": [1.4, 1.4], "speedup_hi": [1.6, 1.6]})
    aim = performance_aim(s, "la")
    assert aim.met.tolist() == [None, True] and pd.isna(aim.speedup_lo[0]) and aim.speedup_lo[1] == 1.4
    assert "not judged" in to_html(aim)


# ------------------------------------------------------------------------------------------- chapter 6


def _needle(seeds: int) -> pd.DataFrame:
    rows = []
    for L in (2048, 4096):
        for depth in (0.25, 0.75):
            for seed in range(seeds):
                for spec, reach in (("dense", True), ("window:1024", depth > 0.5), ("quest:budget=1024", None)):
                    rows.append({"pattern": spec, "length": L, "depth": depth, "seed": seed, "distance": 100,
                                 "reachable": reach, "found": spec != "window:1024" or depth > 0.5})
    return pd.DataFrame(rows)


def test_needle_grid_below_n_is_an_illustration():
    import matplotlib.pyplot as plt

    from studylib.experiments.ch06_decode import explain_needle, needle_summary, plot_needle

    small = _needle(1)  # 2 trials per (pattern, length) cell, as in the cpu profile
    summary = needle_summary(small)
    assert summary.attrs[CAPTION_KEY] == ("Illustration (n = 2 trials per cell): too few to conclude; "
                                          "no CI is shown")
    text = explain_needle(small)
    assert "an illustration on n = 2 trials per cell; too few to conclude" in text
    assert not CONCLUDING.search(text), text
    fig = plot_needle(small)
    assert fig._suptitle.get_text().endswith("(illustration, n = 1 trial per cell)")
    plt.close(fig)
    big = _needle(5)  # 10 trials per cell
    assert CAPTION_KEY not in needle_summary(big).attrs and "illustration" not in explain_needle(big)


@pytest.mark.parametrize("rows", [
    # the smoke run that failed CI: one prompt, a chain of 3 and a tree of 5; the one-line title ran wider
    # than its panel and over the top tick label
    [("eagle@2", "chain", 3, 2.150, 1.981, 1.188), ("eagle@3,2,4", "tree", 5, 1.575, 1.397, 1.117)],
    [("eagle@3", "chain", 4, 1.30, 1.21, 1.9), ("eagle@6", "chain", 7, 1.12, 1.05, 2.4),
     ("eagle@4,2,6", "tree", 7, 1.41, 1.30, 2.6), ("eagle@5,3,10", "tree", 11, 1.33, 1.20, 2.9),
     ("eagle@5,4,16", "tree", 17, 1.10, 1.02, 3.1), ("eagle@6,4,24", "tree", 25, 0.84, 0.80, 3.2)],
])
def test_tree_figure_has_no_defect_and_joins_each_shape(rows):
    import matplotlib

    matplotlib.use("Agg")
    from studylib import plots
    from studylib.experiments.ch02_eagle import tree_figure
    from studylib.workbook.figure_check import figure_defects

    sweep = pd.DataFrame(rows, columns=["method", "shape", "verify_tokens", "speedup", "predicted_speedup",
                                        "model_accelerator_speedup"]).assign(prompts=1)
    with matplotlib.rc_context():  # the workbook style for this figure only: other tests draw with the defaults
        plots.setup()
        ax = tree_figure(sweep, title=ill.title_for("EAGLE: speed-up against tokens verified per step", sweep))
        assert figure_defects(ax.figure) == []
    # a shape's points join up: each (series, shape) line runs through every verify size of that shape
    sizes = {shape: sorted(g.verify_tokens) for shape, g in sweep.groupby("shape")}
    drawn = sorted(sorted(ln.get_xdata()) for ln in ax.lines if len(ln.get_xdata()) and ln.get_linestyle() != ":")
    assert sorted(sz for sz in sizes.values() for _ in range(3)) == drawn
    import matplotlib.pyplot as plt

    plt.close(ax.figure)
