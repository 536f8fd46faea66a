#!/usr/bin/env bash
# Rebuild the EAGLE heads that ship with the study, from nothing, resumably (every step picks up where a
# killed run stopped): the draft corpus (2M answer tokens of the target, `studylib draft-corpus`), a head
# per recipe trained on it as `--preset shipped` trains it, then the side-by-side benchmark that decides
# which ships as `eagle` and whether with FR-Spec's reduced vocabulary (benchmarks/eagle_heads.py, its
# rule declared in its docstring). Hours on a 2-core CPU. Run from the repository root:
#   bash benchmarks/ship_heads.sh
set -euo pipefail
S=${S:-.venv/bin/studylib}
PY=${PY:-.venv/bin/python}
DEST=studylib/assets/drafts
$S draft-corpus
for recipe in eagle3 eagle1; do
  $S train-draft --kind eagle --preset shipped --recipe "$recipe" --out "$DEST/smollm2-135m-$recipe"
done
$PY benchmarks/eagle_heads.py --out reports/bench/eagle_heads --ship "$DEST"
