"""studylib: a reproducible study workbook on fast LLM inference."""

from studylib.errors import StudylibError

__version__ = "0.1.0"
__all__ = ["StudylibError", "__version__"]
