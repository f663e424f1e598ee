"""verispec: lossless speculative decoding. See README.md for the guarantee and the figures."""

from verispec.engine import Generation, GenerationParams, generate, stream
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams

__all__ = ["DraftModelProposer", "Generation", "GenerationParams", "SamplingParams", "generate", "stream"]
