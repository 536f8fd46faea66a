"""Every "Try this" command works as printed: the reproduce ones pass ``studylib reproduce --dry-run``
(parameter names and types against the notebooks, models and patterns resolved), each changes something
in its profile (the class profile), each writes into a folder of its own, and the others parse with their
own command's parser. Their times are measured, never asserted (the closing notes give them)."""

from __future__ import annotations

import shlex

import pytest

from studylib.workbook.exercises import EXERCISES, baseline_command, exercises_markdown, reproduce_command
from studylib.workbook.paths import notebooks_dir
from studylib.workbook.runner import discover, load_profile, parse_overrides

CASES = [(ch, i, ex) for ch, items in EXERCISES.items() for i, ex in enumerate(items, 1)]


def test_every_chapter_has_exercises():
    assert set(EXERCISES) == set(discover(notebooks_dir()))
    assert all(len(items) >= 2 for items in EXERCISES.values())


@pytest.mark.parametrize(("chapter", "number", "exercise"), CASES, ids=[f"ch{c:02d}-{i}" for c, i, _ in CASES])
def test_command_works_as_printed(chapter, number, exercise, monkeypatch, capsys):
    from studylib.cli import build_parser, main

    assert exercise.question.strip() and exercise.look_for.strip()
    profile = load_profile(exercise.profile, notebooks_dir() / "params")
    for command in exercise.commands(chapter):
        argv = shlex.split(command)
        while "=" in argv[0]:  # leading VAR=value assignments, as a shell reads them
            name, value = argv.pop(0).split("=", 1)
            monkeypatch.setenv(name, value)
        assert argv[0] == "studylib", command
        if argv[1] != "reproduce":
            build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown flag or bad value
            continue
        assert main([*argv[1:], "--dry-run"]) == 0, capsys.readouterr().err
        args = build_parser().parse_args(argv[1:])
        overrides = parse_overrides(args.param)
        chapter_cfg = {**profile.get("common", {}), **profile.get(f"ch{int(args.chapters):02d}", {})}
        if overrides:  # the change is a change: at least one value differs from the profile's
            assert any(chapter_cfg.get(k) != v for k, v in overrides.items()), command


def test_values_survive_the_round_trip():
    cmd = reproduce_command(6, {"quality_patterns": ["window:256", "sinks:4,252"], "attention": "sinks:4,60",
                                "n_tokens": 2048, "chunk_size": None})
    argv = shlex.split(cmd)
    params = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert parse_overrides(params) == {"quality_patterns": ["window:256", "sinks:4,252"], "attention": "sinks:4,60",
                                       "n_tokens": 2048, "chunk_size": None}


def test_markdown_lists_question_look_for_and_command():
    text = exercises_markdown(5)
    assert text.startswith("## Try this") and "*Look for:*" in text
    assert "studylib reproduce --profile class --chapters 5" in text and "bench-serve" in text
    assert baseline_command(5) in text  # the unchanged run each exercise is compared with
    assert exercises_markdown(99) == ""


def test_every_exercise_has_its_own_folder_and_the_class_profile():
    from studylib.workbook.paths import PROFILES

    folders = [ex.folder(ch) for ch, _, ex in CASES]
    assert len(set(folders)) == len(folders)
    assert not any(f.endswith("-baseline") for f in folders)  # the unchanged run keeps its own
    assert {ex.profile for _, _, ex in CASES} == {"class"} and "class" in PROFILES
    for ch, _, ex in CASES:
        for command in ex.commands(ch):
            assert ex.folder(ch) in command, command
    assert main_dry_run(baseline_command(3)) == 0


def main_dry_run(command: str) -> int:
    from studylib.cli import main

    return main([*shlex.split(command)[1:], "--dry-run"])


def test_every_exercise_writes_to_a_folder_of_its_own():
    from studylib.workbook.exercises import EXERCISES

    folders = [ex.folder(ch) for ch, items in EXERCISES.items() for ex in items]
    assert len(folders) == len(set(folders))
    for ch, items in EXERCISES.items():
        for ex in items:
            for cmd in ex.commands(ch):
                # a chapter rerun writes its reports there; a serving benchmark its per-request records
                assert f"--out {ex.folder(ch)}" in cmd or f"--records {ex.folder(ch)}/" in cmd, cmd


def test_a_serving_exercise_writes_its_records_where_it_says(tmp_path):
    """bench-serve makes the records' folder, so the printed command runs as it stands."""
    import shlex

    from studylib.cli import main
    from studylib.workbook.exercises import Exercise

    ex = Exercise("t", "q", "l", command="studylib bench-serve --workload synthetic --num-requests 2 "
                  "--max-new-tokens 2 --model tiny-random")
    cmd = ex.commands(5)[0]
    assert cmd.endswith(f"--records {ex.folder(5)}/requests.jsonl")
    out = tmp_path / "new" / "requests.jsonl"
    assert main(shlex.split(cmd)[1:-1] + [str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2
