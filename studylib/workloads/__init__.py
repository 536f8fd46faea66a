"""Seeded workload generators (chapter 4's shared-prefix shapes live in ``prefix``)."""
