"""``studylib sweep SPEC.yaml``: the study's grid of chapter runs on Ray (``spec`` reads the grid,
``run`` executes each cell as a Ray task, ``page`` puts the cells side by side in the book)."""
