"""The workbook: chapter notebooks executed by papermill into reports with verdicts.

Notebooks call ``show_provenance(...)`` at the top and ``save_chapter(...)`` at the end;
``studylib reproduce`` (``studylib.workbook.runner.reproduce``) runs them and writes the index.
"""

from studylib.workbook.chapter import save_chapter, show_provenance, to_jsonable

__all__ = ["save_chapter", "show_provenance", "to_jsonable"]
