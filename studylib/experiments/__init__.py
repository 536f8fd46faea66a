"""Measurement code for the workbook chapters: one module per chapter, returning DataFrames and dicts."""
