"""HumanEval pass@1: run each completion against the problem's unit tests in a separate process.

Model output is untrusted code, so it never runs in this interpreter: each program (prompt +
completion + tests + ``check(entry_point)``) is written to a fresh temporary directory and run with
``python -I`` in its own session, under a timeout that kills the whole process group, and with a
memory limit. This is isolation against accidents (infinite loops, runaway memory, stray files), not
a security sandbox.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from studylib.errors import StudylibError
from studylib.prompts import PromptRecord

# The stop sequences of the HumanEval paper: a completion ends where top-level code resumes.
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")
MEMORY_LIMIT_BYTES = 2 << 30


@dataclass
class ExecResult:
    task_id: str
    passed: bool
    reason: str  # "passed", "timed out after Ns", or the last line of the traceback / exit status


def trim_completion(text: str) -> str:
    """Cut a completion at the first stop sequence, so trailing chatter or extra tests don't run."""
    cut = min((i for s in STOP_SEQUENCES if (i := text.find(s)) != -1), default=len(text))
    return text[:cut]


def program(problem: PromptRecord | dict, completion: str) -> str:
    """The script that passes iff the completion is correct."""
    if isinstance(problem, PromptRecord):
        prompt, meta = problem.prompt, problem.meta
    else:
        prompt, meta = problem["prompt"], problem
    if prompt is None or "test" not in meta or "entry_point" not in meta:
        raise StudylibError("a HumanEval problem needs 'prompt', 'test' and 'entry_point'; "
                            "load it with studylib.data.load_workload('humaneval').")
    return f"{prompt}{completion}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\n"


# The child caps its own address space before running the program; a preexec_fn would do the same
# but is unsafe when evaluate() runs programs from several threads.
_LAUNCHER = (
    "import resource, runpy, sys\n"
    "try:\n"
    f"    resource.setrlimit(resource.RLIMIT_AS, ({MEMORY_LIMIT_BYTES}, {MEMORY_LIMIT_BYTES}))\n"
    "except (ValueError, OSError):\n"
    "    pass\n"
    "runpy.run_path(sys.argv[1], run_name='__main__')\n"
)


def run_program(source: str, timeout: float = 10.0) -> tuple[bool, str]:
    """Run ``source`` in a subprocess: (passed, reason).

    A clean exit alone is not a pass: code that calls ``sys.exit(0)`` before the tests would get one.
    The program must also print a random token appended after its last line.
    """
    nonce = secrets.token_hex(16)
    source = f"{source}\nprint({nonce!r})\n"
    with tempfile.TemporaryDirectory(prefix="studylib-humaneval-") as tmp:
        path = Path(tmp) / "program.py"
        path.write_text(source, encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _LAUNCHER, str(path)], cwd=tmp, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # The program may have forked; kill its whole session, not just the direct child.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return False, f"timed out after {timeout:g}s"
    if proc.returncode == 0:
        if nonce in out:
            return True, "passed"
        return False, "exited with status 0 before the tests finished"
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    if lines:
        return False, lines[-1].strip()[:300]
    if proc.returncode < 0:
        return False, f"killed by signal {-proc.returncode}"
    return False, f"exit status {proc.returncode}"


def check(problem: PromptRecord | dict, completion: str, timeout: float = 10.0, trim: bool = True) -> ExecResult:
    """Does ``completion`` (the text the model generated after the prompt) pass the problem's tests?"""
    task_id = problem.id if isinstance(problem, PromptRecord) else problem.get("task_id", "?")
    text = trim_completion(completion) if trim else completion
    passed, reason = run_program(program(problem, text), timeout)
    return ExecResult(task_id, passed, reason)


def evaluate(problems: list[PromptRecord], completions: list[str], timeout: float = 10.0,
             workers: int = 1, trim: bool = True) -> list[ExecResult]:
    """Check each completion against its problem; ``workers`` programs run at once."""
    if len(problems) != len(completions):
        raise StudylibError(f"{len(problems)} problems but {len(completions)} completions; pair them up.")
    if workers < 1:
        raise StudylibError("workers must be at least 1.")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        pairs = zip(problems, completions, strict=True)
        return list(pool.map(lambda pc: check(pc[0], pc[1], timeout, trim), pairs))


def pass_at_1(results: list[ExecResult]) -> float:
    """Fraction of problems solved with one greedy sample each."""
    if not results:
        raise StudylibError("no HumanEval results to score.")
    return sum(r.passed for r in results) / len(results)
