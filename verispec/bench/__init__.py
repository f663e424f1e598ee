"""`verispec bench`: a prompt suite, interleaved timed runs of ours and peers, and the report."""
