"""The reference executor: every candidate run for real over a routing trace (DESIGN §8)."""
from .decode import CandidateDecoder, LayerRecord, PromptRun
from .run import ExecutorSettings, measure

__all__ = ["CandidateDecoder", "ExecutorSettings", "LayerRecord", "PromptRun", "measure"]
