"""Where traces come from besides synthesis: collection from Hugging Face models (with the hidden
states and the next-layer predictor trained on them), tiny random-weight models for tests and
demos, and importers of other tools' records. torch and transformers live here, never in the
analysis modules of :mod:`cope_core.trace`."""
