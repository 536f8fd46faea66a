"""Training the study's drafters: the corpus of the target's own answers and features (``corpus``), the
distilled draft model (``data``, ``train``) and the EAGLE heads (``eagle_train``, ``head_train``).

Training imports the decoders it trains for (``studylib.decoding``) and never the other way round: a
decoder reads a trained drafter through ``studylib.decoding.draft_files`` only."""
