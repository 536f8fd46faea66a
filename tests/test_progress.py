"""The workbook's quiet environment turns off every library progress bar, even one a caller asked for."""

from studylib.progress import enabled, progress_bar


def test_environment_wins_over_an_explicit_request(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("STUDYLIB_PROGRESS", "1")
    assert enabled(None) and enabled(True) and not enabled(False)
    assert not progress_bar(range(3), progress=True).disable
    assert progress_bar(range(3), progress=False).disable
    monkeypatch.setenv("STUDYLIB_PROGRESS", "0")
    assert progress_bar(range(3), progress=True).disable and not enabled(True)
    monkeypatch.setenv("STUDYLIB_PROGRESS", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert progress_bar(range(3), progress=True, disable=False).disable
    assert list(progress_bar(range(3), progress=True)) == [0, 1, 2]
