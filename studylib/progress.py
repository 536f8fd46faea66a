"""One place that decides whether a progress bar is drawn.

The workbook runner executes chapters with ``STUDYLIB_PROGRESS=0`` and ``TQDM_DISABLE=1`` in the
kernel's environment so bars never land in a rendered report. tqdm reads ``TQDM_DISABLE`` only as a
default, and a call that passes ``disable=False`` explicitly overrides it, so every library bar goes
through ``progress_bar`` here, where the environment wins over the caller.
"""

from __future__ import annotations

import os


def quiet() -> bool:
    """True when the environment asked for no progress bars."""
    return os.environ.get("STUDYLIB_PROGRESS", "1") == "0" or os.environ.get("TQDM_DISABLE", "") not in ("", "0")


def enabled(progress: bool | None = None) -> bool:
    """Bars unless the environment or the caller (``progress=False``) said no."""
    return not quiet() and progress is not False


def progress_bar(iterable=None, *, progress: bool | None = None, **kwargs):
    """``tqdm.auto.tqdm(iterable, **kwargs)``, disabled when ``enabled(progress)`` is False."""
    from tqdm.auto import tqdm

    kwargs["disable"] = bool(kwargs.get("disable", False)) or not enabled(progress)
    return tqdm(iterable, **kwargs)
