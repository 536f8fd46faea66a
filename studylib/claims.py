"""The study's claims (C1..C8), verdict records, and the rules that turn measurements into verdicts.

A verdict is never typed by hand: each chapter passes its measurements to a rule (``judge_at_least``,
``judge_at_most``, ``judge_all``) and the rule decides between "holds", "holds under conditions" and
"does not hold". The ids, sections and wording follow ``shared/CLAIMS.md``; the Chinese quotes are
taken verbatim from the source document.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from studylib.errors import StudylibError

HOLDS, CONDITIONAL, FAILS = "holds", "holds under conditions", "does not hold"
VERDICTS = (HOLDS, CONDITIONAL, FAILS)


@dataclass(frozen=True)
class Claim:
    id: str
    section: str
    quote_zh: str  # verbatim from the source document
    text: str  # faithful English rendering
    decides: str  # the measurement that decides it


CLAIMS: dict[str, Claim] = {c.id: c for c in (
    Claim("C1", "1.1",
          "这种强时序依赖的生成机制，本质上是将语言建模为一条不可并行的因果链：模型必须完整计算当前 token 的"
          "概率分布后，才能启动下一个 token 的预测。正因如此，它天然受限于序列长度与解码步数的线性耦合关系，"
          "形成难以逾越的速度瓶颈。",
          "Autoregressive decoding is a causal chain: each token waits for the previous one, so latency grows "
          "linearly with the number of decoding steps and cannot be parallelised.",
          "Latency vs. output length is linear (fit, R^2); time per step vs. batch size shows the step is bound "
          "by memory traffic, not arithmetic, at small batch."),
    Claim("C2", "1.2",
          "计算资源消耗大，也不单体现为GPU卡数的堆叠，更折射出推理路径中大量重复访存、低效激活与未被释放的中间状态。",
          "Inference cost is dominated by memory traffic and held state (\"repeated memory access, inefficient "
          "activations, unreleased intermediate states\"), not only by parameter count.",
          "Measured bytes moved per token (weights + KV cache) vs. the machine's bandwidth; KV-cache memory vs. "
          "context length and batch; achieved fraction of the bandwidth/compute roofline."),
    Claim("C3", "2.1",
          "一次前向传播中并行预测多个候选 token，再通过轻量级验证机制筛选最优路径。……它不牺牲语义连贯性，"
          "却悄然重写了响应的时间契约。",
          "Parallel decoding predicts several candidate tokens in one forward pass and verifies them with a "
          "light check, without losing coherence.",
          "Lossless methods give token-identical greedy output and an unchanged sampling distribution; tokens "
          "per target forward pass > 1; wall-clock speedup with CI."),
    Claim("C4", "2.2",
          "前缀树（Trie）在此并非冷峻的数据结构术语，而是一张由历史请求织就的语义地图：它将共享前缀的请求聚类锚定，"
          "使缓存命中率从偶然升华为必然。",
          "A prefix tree (trie) over past requests clusters shared prefixes so that cache hits become "
          "\"inevitable rather than accidental\".",
          "Prefix-cache hit rate, prefill tokens saved and time-to-first-token on workloads with shared "
          "prefixes; outputs identical with and without the cache."),
    Claim("C5", "2.2",
          "动态批处理则如一位经验老到的调度指挥官，在毫秒级窗口内实时聚合异构请求，既避免静态批处理的空等损耗，"
          "又消解小批量请求的资源碎片化困境。",
          "Dynamic batching aggregates heterogeneous requests within millisecond windows, avoiding both the "
          "idle waits of static batching and the fragmentation of small batches.",
          "Throughput, TTFT and TPOT (p50/p99) of sequential vs. static vs. continuous batching under Poisson "
          "arrivals at several request rates; hardware utilisation."),
    Claim("C6", "2.3",
          "新型稀疏注意力、滑动窗口注意力与记忆增强注意力，则赋予模型“选择看什么”的认知主权。它们主动剪裁无关上下文，"
          "压缩长程依赖的计算爆炸，使注意力计算复杂度脱离序列长度的平方律束缚。……当99%以上的原始生成质量得以稳稳托住",
          "Sparse, sliding-window and memory-augmented attention prune irrelevant context and free attention "
          "from the quadratic cost in sequence length, while keeping >99% of generation quality.",
          "Attention time and memory vs. sequence length (fitted exponent) for dense vs. sparse kernels; "
          "perplexity ratio and generation agreement vs. dense at long context."),
    Claim("C7", "abstract, 1.3, 2.1, 3",
          "实证表明，先进推理架构能在保持99%以上原始生成质量的同时，将端到端延迟降低10倍以上，吞吐量提升8–12倍。",
          "Advanced inference architectures keep >99% of original generation quality while reducing end-to-end "
          "latency by more than 10x and raising throughput 8-12x.",
          "Stack the techniques on named workloads; report quality retained, latency reduction and throughput "
          "gain against the plain autoregressive baseline, each with CI."),
    Claim("C8", "1.3",
          "这些方法多聚焦局部加速，缺乏对“生成质量—推理效率”这一核心矛盾的全局协同设计。",
          "Existing methods mostly accelerate locally; the quality-efficiency trade-off needs a global, "
          "co-designed view.",
          "The combined chapter shows how the gains interact (speculative gains shrinking as batch grows; "
          "prefix caching helping TTFT but not TPOT)."),
)}


@dataclass
class Verdict:
    id: str
    claim: str
    metric: str
    measured: float | str | None
    ci: tuple[float, float] | None
    claimed: str
    verdict: str
    conditions: str
    chapter: int

    def __post_init__(self) -> None:
        if self.id not in CLAIMS:
            raise ValueError(f"unknown claim id {self.id!r}; the study's claims are {list(CLAIMS)}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.ci is not None:
            self.ci = (float(self.ci[0]), float(self.ci[1]))
        if not self.claim:
            self.claim = CLAIMS[self.id].text

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        ci = d.get("ci")
        return cls(id=d["id"], claim=d.get("claim", ""), metric=d["metric"], measured=d.get("measured"),
                   ci=tuple(ci) if ci is not None else None, claimed=d.get("claimed", ""),
                   verdict=d["verdict"], conditions=d.get("conditions", ""), chapter=int(d["chapter"]))


def _point_ci(est: Any) -> tuple[float, tuple[float, float] | None]:
    """Accept an ``Estimate``, a dict with value/ci_low/ci_high, a (value, low, high) tuple or a number."""
    if hasattr(est, "value") and hasattr(est, "ci_low"):
        return float(est.value), (float(est.ci_low), float(est.ci_high))
    if isinstance(est, Mapping):
        if "ci_low" in est:
            return float(est["value"]), (float(est["ci_low"]), float(est["ci_high"]))
        return float(est["value"]), None
    if isinstance(est, Sequence) and not isinstance(est, str) and len(est) == 3:
        return float(est[0]), (float(est[1]), float(est[2]))
    return float(est), None


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _judge_bound(claim_id, metric, estimate, threshold, claimed, conditions, chapter, partial, sign) -> Verdict:
    """Shared logic of at_least (sign=+1) and at_most (sign=-1): compare sign*value with sign*threshold."""
    word = ">=" if sign > 0 else "<="
    lenient = threshold if partial is None else partial

    def meets(x: float, bound: float) -> bool:
        return not math.isnan(x) and sign * x >= sign * bound

    def decide(value, ci) -> str:
        # The CI end nearest the threshold must clear it (the point value when there is no CI).
        safe = value if ci is None else (ci[0] if sign > 0 else ci[1])
        if meets(safe, threshold):
            return HOLDS
        return CONDITIONAL if meets(value, lenient) else FAILS

    if isinstance(estimate, Mapping) and "value" not in estimate:
        # One estimate per workload/condition: holds only if every one holds.
        if not estimate:
            raise ValueError("judge needs at least one estimate")
        points = {k: _point_ci(v) for k, v in estimate.items()}
        per = {k: decide(*pc) for k, pc in points.items()}
        best = max(points, key=lambda k: sign * points[k][0])
        value, ci = points[best]
        ok = [k for k, v in per.items() if v != FAILS]
        bad = [k for k, v in per.items() if v == FAILS]
        if all(v == HOLDS for v in per.values()):
            verdict = HOLDS
        elif ok:
            verdict = CONDITIONAL
        else:
            verdict = FAILS
        detail = ", ".join(f"{k}: {_fmt(points[k][0])}" for k in points)
        note = f"per condition ({metric} {word} {_fmt(threshold)}): {detail}"
        if verdict == CONDITIONAL:
            note = _join(note, f"meets it on {', '.join(ok)}", f"not on {', '.join(bad)}" if bad else "")
        return Verdict(claim_id, "", metric, value, ci, claimed, verdict,
                       _join(conditions, f"best case shown: {best}", note), chapter)

    value, ci = _point_ci(estimate)
    verdict = decide(value, ci)
    note = ""
    if verdict == CONDITIONAL:
        if meets(value, threshold):
            note = f"the point estimate meets {word} {_fmt(threshold)} but the CI crosses it"
        else:
            note = f"reaches {_fmt(lenient)}, short of the claimed {_fmt(threshold)}"
    return Verdict(claim_id, "", metric, value, ci, claimed, verdict, _join(conditions, note), chapter)


def judge_at_least(claim_id: str, metric: str, estimate: Any, threshold: float, claimed: str,
                   conditions: str, chapter: int, partial: float | None = None) -> Verdict:
    """Holds if the CI's low end is >= ``threshold``; holds under conditions if the point value is >=
    ``partial`` (default: the threshold) or, for a dict of per-workload estimates, if only some workloads
    meet it; otherwise does not hold."""
    return _judge_bound(claim_id, metric, estimate, threshold, claimed, conditions, chapter, partial, +1)


def judge_at_most(claim_id: str, metric: str, estimate: Any, threshold: float, claimed: str,
                  conditions: str, chapter: int, partial: float | None = None) -> Verdict:
    """Mirror of ``judge_at_least``: holds if the CI's high end is <= ``threshold``."""
    return _judge_bound(claim_id, metric, estimate, threshold, claimed, conditions, chapter, partial, -1)


def judge_all(claim_id: str, metric: str, checks: Mapping[str, bool], claimed: str, conditions: str,
              chapter: int, measured: Any = None) -> Verdict:
    """Holds if every named check passes, holds under conditions if some do, does not hold if none do.

    ``measured`` (optional) is the headline number shown in the table, as a value or an estimate.
    """
    if not checks:
        raise ValueError("judge_all needs at least one check")
    passed = [k for k, v in checks.items() if bool(v)]
    failed = [k for k, v in checks.items() if not bool(v)]
    verdict = HOLDS if not failed else (CONDITIONAL if passed else FAILS)
    value, ci = (_point_ci(measured) if measured is not None else (f"{len(passed)}/{len(checks)} checks", None))
    note = _join(f"passes: {', '.join(passed)}" if passed else "",
                 f"fails: {', '.join(failed)}" if failed else "")
    return Verdict(claim_id, "", metric, value, ci, claimed, verdict, _join(conditions, note), chapter)


# ----------------------------------------------------------------------------------------- display

_COLOURS = {HOLDS: "#d9f2d9", CONDITIONAL: "#fff1c2", FAILS: "#f8d4d4"}


def format_measured(measured: Any, ci: tuple[float, float] | None) -> str:
    if measured is None:
        return "n/a"
    if isinstance(measured, int | float):
        text = _fmt(float(measured))
        return f"{text} [{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci is not None else text
    return str(measured)


def verdict_frame(verdicts: Sequence[Verdict]):
    import pandas as pd

    rows = [{"id": v.id, "claim": v.claim, "metric": v.metric, "measured [95% CI]": format_measured(v.measured, v.ci),
             "claimed": v.claimed, "verdict": v.verdict, "conditions": v.conditions, "chapter": v.chapter}
            for v in verdicts]
    cols = ["id", "claim", "metric", "measured [95% CI]", "claimed", "verdict", "conditions", "chapter"]
    return pd.DataFrame(rows, columns=cols)


def verdict_table(verdicts: Sequence[Verdict]):
    """A pandas Styler that renders as a compact HTML table with coloured verdicts (no index)."""
    df = verdict_frame(verdicts)
    styler = df.style.hide(axis="index").map(lambda v: f"background-color: {_COLOURS.get(v, '')}",
                                             subset=["verdict"])
    styler = styler.set_table_attributes('class="verdict-table"')
    return styler.set_table_styles([
        {"selector": "", "props": "border-collapse: collapse; font-size: 0.85em; width: 100%;"},
        {"selector": "th", "props": "text-align: left; background: #f0f0f0; padding: 4px 6px;"},
        {"selector": "td", "props": "text-align: left; vertical-align: top; padding: 4px 6px; "
                                    "border-top: 1px solid #ddd;"},
        {"selector": "td.col1, td.col6", "props": "min-width: 16em; max-width: 30em;"},
        {"selector": "td.col5", "props": "font-weight: bold; white-space: nowrap;"},
    ])


def verdict_text(verdicts: Sequence[Verdict], width: int = 48) -> str:
    """Plain-text table for terminals; long cells are shortened."""
    df = verdict_frame(verdicts).drop(columns=["claim"])
    df["conditions"] = df["conditions"].map(lambda s: s if len(s) <= width else s[: width - 3] + "...")
    return df.to_string(index=False)


# ----------------------------------------------------------------------------------------- loading

def chapter_files(profile_dir: str | Path) -> list[Path]:
    return sorted(p for p in Path(profile_dir).glob("ch[0-9][0-9].json"))


def load_chapter(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StudylibError(f"cannot read {path} ({exc}); rerun that chapter with `studylib reproduce`.") from None
    data["verdicts"] = [Verdict.from_dict(v) for v in data.get("verdicts", [])]
    return data


def load_verdicts(profile_dir: str | Path) -> list[Verdict]:
    """Every verdict in ``<profile_dir>/chNN.json``: the combined chapter's headline first (it is the
    study's conclusion), then by claim id and chapter."""
    out = [v for f in chapter_files(profile_dir) for v in load_chapter(f)["verdicts"]]
    return sorted(out, key=lambda v: (v.chapter != 7, int(v.id[1:]), v.chapter))
