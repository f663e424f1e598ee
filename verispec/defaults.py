"""Hardware-dependent defaults: the fastest exact configuration we measured for a machine.

One module, imported by the command line (`generate`, `serve`, `bench`) and by the scripts in benchmarks/, so
that every entry point answers the same question the same way. Each default names the measurement behind it
(the folders under benchmarks/results/). Plain functions of plain values: no torch, no models.
"""

from __future__ import annotations

__all__ = ["DEFAULT_STRATEGY", "DEFAULT_DRAFT_CONTEXT", "AVX2_DRAFT_CONTEXT", "DEFAULT_DTYPE", "DEFAULT_DEVICE",
           "default_dtype", "default_draft_context", "draft_window", "default_gamma", "default_draft_dtype", "default_draft_vocab",
           "default_verify_cost", "describe"]

# Prompt lookup where the last 3 tokens recur, else the draft model with its length chosen per round, down to 0
# (a plain step) where drafting does not pay. draft+ngram at a fixed gamma was +24-28% decode tok/s over `draft`
# on 10 code prompts (benchmarks/results/2026-11-23-epyc-avx512-w4a8-draft-ngram-vs-llamacpp) but 0.77-0.93x
# llama.cpp's plain decoding on prose once our plain step matched its (2026-11-24-epyc-avx512-six-bit-fused-vs-
# llamacpp); `auto` is 1.53x our plain decoding against draft+ngram's 1.33x over translation, summarization, math
# and code (benchmarks/profile_round.py, 2026-11-24-epyc-avx512-auto-strategy).
DEFAULT_STRATEGY = "auto"
# The draft model reads a prompt's first 4 tokens and its last 256 (None: all of it; proposers.draft_model.
# draft_context), so its own prefill stops growing with the prompt. On 3 prompts of 1544-1870 tokens (128 new
# tokens, greedy, Intel Xeon) `auto` was 0.84x plain decoding over the whole request reading all of each prompt
# (its prefill, after the first token, took longer than speculation saved) and 1.01-1.02x reading 256 (512:
# 0.98x); on 10 suite prompts of rag, summarization, code edit, translation and code completion 1.32x against
# 1.31x (benchmarks/results/2026-11-25-xeon-amx-draft-context). Prompts up to 260 tokens are read whole anyway.
DEFAULT_DRAFT_CONTEXT: int | None = 256
# With the kernel's 256-bit builds a prefill takes longer (AVX2: ~2.5x the AVX-512 build's time for 160 tokens on a
# Zen 5), so the draft's own prefill weighs more there: see default_draft_context.
AVX2_DRAFT_CONTEXT = 64
DEFAULT_DTYPE = "bfloat16"  # the target as the GGUF defines it (dequantized): the faithful one, and the fallback
DEFAULT_DEVICE = "cpu"


def default_dtype(device: str = DEFAULT_DEVICE, kernel_isas: tuple[str, ...] | list[str] = ()) -> str:
    """The target's precision when none is asked for: the fastest exact one for the hardware.

    On a CPU that runs verispec's w4a8 kernel (`kernel_isas`: its builds this CPU can run, from
    verispec.models.kernels.available_isas(): AVX-512 VNNI, or AVX2 with FMA and F16C), w4a8: its rows do not
    depend on the row count, so greedy speculation stays bit-exact, and it decodes 1.5x the bf16 default's
    tokens/s on 10 code prompts (29.19 against 19.82 tok/s, benchmarks/results/2026-11-23-epyc-avx512-*); on a
    CPU without AVX-512 bf16 the bf16 target is emulated besides. Elsewhere (GPU, other CPUs) bfloat16.

    >>> default_dtype("cpu", ["avx512", "avx2"]), default_dtype("cpu", []), default_dtype("cuda", ["avx2"])
    ('w4a8', 'bfloat16', 'bfloat16')
    """
    return "w4a8" if device == "cpu" and kernel_isas else DEFAULT_DTYPE


def default_draft_context(kernel_isa: str | None = None) -> int | None:
    """The draft model's prompt window (its first 4 tokens and last N) when --draft-context is not given; kernel_isa:
    the w4a8 kernel build the target runs on (None: not a w4a8 target).

    DEFAULT_DRAFT_CONTEXT (256), except beside the kernel's 256-bit builds (AVX2, AVX-VNNI), whose prefill is
    compute-bound, so that the draft's own prefill of a suite prompt (62-393 tokens with the chat template) weighs a
    tenth of a request: AVX2_DRAFT_CONTEXT (64) there. `auto`, 128 new tokens, greedy, each build forced on a Zen 5
    (benchmarks/results/2026-12-07-zen5-avx2build-draft-context), whole requests over our plain decoding: AVX2 build
    1.40x / 1.43x / 1.47x / 1.46x reading 256 / 128 / 64 / 32 tokens over 9 code prompts and 1.07x / 1.11x / 1.13x
    (256 / 128 / 64) over 18 prompts of all nine categories; AVX-VNNI build 1.11x / 1.13x (256 / 64, 18 prompts);
    AVX-512 build 1.45x both, so it keeps 256 (its accepted length 3.15 against 2.82). The window only changes what
    the draft reads: lossless at any size.

    >>> default_draft_context("avx512"), default_draft_context("avxvnni"), default_draft_context("avx2")
    (256, 64, 64)
    >>> default_draft_context(None)
    256
    """
    return AVX2_DRAFT_CONTEXT if kernel_isa in ("avx2", "avxvnni") else DEFAULT_DRAFT_CONTEXT


def draft_window(given: int | None, kernel_isa: str | None = None) -> int | None:
    """The window the draft reads: --draft-context as `given`, else default_draft_context(kernel_isa); None (and a
    given 0) is the whole prompt.

    >>> draft_window(None, "avx2"), draft_window(9, "avx2"), draft_window(0), draft_window(None)
    (64, 9, None, 256)
    """
    return (default_draft_context(kernel_isa) if given is None else given) or None


def default_gamma(dtype: str = DEFAULT_DTYPE, device: str = DEFAULT_DEVICE, kernel_isa: str | None = None) -> int:
    """Tokens drafted per round when none is asked for (`auto` chooses each round's length up to it).

    γ = 8 where verification is nearly free: a bfloat16 or float32 target on a CPU is bound by reading 3 GB of
    weights, so 9 tokens cost ~1.3x one (benchmarks/results/2026-11-23-epyc-avx512-bf16-draft-ngram-gamma: 2.55x
    over plain against 2.33x with γ = 4, 10 code prompts). A w4a8 target's few-row matmuls are compute-bound: with
    the AVX-512 VNNI build (kernel_isa "avx512") 4 tokens cost 1.06x a step and 8 1.47x on an AMD EPYC, and `auto`
    capped at 6 decoded 1.35x / 1.42x our plain decoding greedy against 1.34x / 1.40x at 4, and 1.38x / 1.42x
    against 1.31x / 1.39x at T = 0.7 (two runs of 18 suite prompts; 8: 1.31x, 1.33x; benchmarks/results/
    2026-11-26-epyc-avx512-auto-gamma-cap*). On an AMD EPYC Zen 5, where 8 tokens cost 1.32x a step, caps 6 and 8
    both gave 1.48x over 18 suite prompts greedy (2026-12-01-zen5-avx512-auto-gamma-cap). The AVX2 build's
    verification costs more (1.4x a step for 2 tokens on that CPU), and 4 stays there, with the AVX-VNNI build (5
    tokens 1.83x a step against the AVX2 build's 2.04x, its EVEX stand-in on that CPU: 2026-11-27-epyc-avxvnni-build;
    on an Intel Xeon with real AVX-VNNI caps 4, 6 and 8 decoded within 1-3% of each other, greedy and at T = 0.7:
    2026-12-06-xeon-amx-avxvnni-gamma-cap) and elsewhere (GPU).

    >>> default_gamma("bfloat16", "cpu"), default_gamma("w4a8", "cpu", "avx512"), default_gamma("w4a8", "cpu", "avx2")
    (8, 6, 4)
    >>> default_gamma("bfloat16", "cuda")
    4
    """
    if device == "cpu" and dtype in ("bfloat16", "float32"):
        return 8
    return 6 if device == "cpu" and (dtype or "").startswith("w4a8") and kernel_isa == "avx512" else 4


def default_draft_dtype(dtype: str = DEFAULT_DTYPE, device: str = DEFAULT_DEVICE) -> str:
    """The draft's precision beside a target of precision `dtype`; it never changes the output distribution.

    On a CPU a quantized draft is faster at about the same acceptance: 4-bit weights beside a bfloat16, int8,
    int4 or w8a8 target (the fastest of int8, int4 and w8a8 drafts beside both bf16 and w8a8 targets,
    benchmarks/profile_round.py), and w4a8-4bit beside a w4a8 target (its kernel is built by then; it drafts
    ~7% faster than int4). Elsewhere, and beside a float32 target, the target's own precision.

    >>> default_draft_dtype("bfloat16"), default_draft_dtype("w4a8"), default_draft_dtype("float32")
    ('int4', 'w4a8-4bit', 'float32')
    """
    if device != "cpu":
        return dtype
    if dtype.startswith("w4a8"):
        return "w4a8-4bit"
    return "int4" if dtype in ("bfloat16", "int8", "int4", "w8a8") else dtype


def default_draft_vocab(draft_dtype: str, device: str = DEFAULT_DEVICE) -> int | None:
    """LM-head rows the draft keeps when --draft-vocab is not given (None: all): it then proposes only ids below.

    The 4-bit draft's head is 85 of the ~310 MB it reads a token (0.5B draft, 151936 ids); the first 65536 ids
    (byte-level BPE ids run roughly in merge order, so frequent tokens come first) hold 97.8% of the target's
    tokens over 210k tokens of suite outputs, and the head then reads 37 MB. Measured side by side on 9 suite
    prompts (one per category, greedy, 128 tokens; Intel Xeon, AVX-512 build): draft 16.5 -> 14.6 ms a token,
    accepted length 3.26 -> 3.25, `auto` 1.27x -> 1.33x plain decoding (benchmarks/results/
    2026-11-25-xeon-amx-draft-vocab). A CPU draft step is bound by reading weights on either kernel build; only
    the w4a8 draft is measured. Lossless whatever the size: ids the draft cannot propose have q = 0, and the
    verifier's residual supplies them.

    >>> default_draft_vocab("w4a8-4bit"), default_draft_vocab("int4"), default_draft_vocab("w4a8-4bit", "cuda")
    (65536, None, None)
    """
    return 65536 if device == "cpu" and draft_dtype.startswith("w4a8") else None


def default_verify_cost(device: str = DEFAULT_DEVICE, *, kernel_isa: str | None = None,
                        triton: bool | None = None) -> list[tuple[int, float]]:
    """A target forward over k tokens in one-token units, (k, cost) points, for strategies that choose their
    draft length per round (`auto`) before they have measured anything. kernel_isa: the w4a8 kernel build the
    target runs on (None: not a w4a8 target). triton: on a GPU, whether Triton attends a forward's queries in one
    launch (None: whether it can be imported).

    On a CPU a w4a8 target's few-row matmuls are compute-bound: with the AVX-512 VNNI build 2 tokens cost ~1.05x
    a step, 5 tokens 1.25x, 9 1.65x, 16 ~2.9x; with the AVX2 build 1.08x, 1.32x, 2.1x and ~3.45x (the Intel Xeon,
    medians of 24 forwards at a 300-token context, and `bench --costs` for 16; AMD EPYC's AVX-512 build measured
    1.16 / 1.11 / 1.52 / 2.81x for 2 / 4 / 8 / 16). `auto` planning with these curves instead of the ones before
    the AVX2 build's fixes (1.4 / 2.6 / 4.2x for 2 / 5 / 9) and an older AVX-512 one (1.15 / 1.6 / 2.3x) chose
    longer drafts and decoded 1.31x plain decoding against 1.23x on the AVX2 build greedy (9 suite prompts), 1.30x
    against 1.25x at T = 0.7 (3 seeds), and 1-2% faster on the AVX-512 build (benchmarks/results/
    2026-11-25-xeon-verify-cost-curves). Re-measured after the weights' prefetch into L2 made the one-token step
    cheaper (AVX-512 1.09 / 1.32 / 1.7 / 2.42x, AVX2 1.15 / 1.44 / 2.33 / 3.74x), those curves drafted shorter and
    ran no faster (1.349 vs 1.362x, 1.246 vs 1.251x plain decoding greedy: 2026-11-25-xeon-prefetch-l2), so these
    stay. The AVX-VNNI build plans with the AVX2 curve: on an Intel Xeon with real AVX-VNNI it verified 2 / 5 / 8
    tokens in 1.05 / 1.32 / 1.71x a step (2026-12-04-xeon-isa-builds) and 2 / 4 / 8 / 16 in 1.10 / 1.27 / 1.74 /
    3.23x (2026-12-06-xeon-amx-avxvnni-gamma-cap), close to that curve, and its EVEX stand-in on the AMD EPYC in
    1.30 / 1.83 / 2.51x for 2 / 5 / 8, nearer the AVX2 build's 1.36 / 2.04 / 3.29x than the AVX-512 build's 1.00 /
    1.39 / 1.99x (2026-11-27-epyc-avxvnni-build). A bf16 target is bound by
    reading 3 GB of weights (5 tokens ~1.05x, 9
    ~1.3x). On a GPU an eager forward is bound by its kernel launches; a forward of up to 16 tokens attends each
    of them on its own (llama.EXACT_ATTENTION_MAX) in one Triton launch (models.triton_attention): an H200 with
    random weights of the 1.5B target's shapes took 23.3 / 19.7 / 19.3 / 20.9 / 25.6 ms for 1 / 2 / 4 / 8 / 16
    tokens (benchmarks/cuda_check.py, 2026-11-27, run 5; the one-token figure, above the two-token one, taken as
    19.7). Without Triton one call a query: 19.4 / 27.0 / 32.3 / 45.0 / 69.1 ms (run 5's one-query-calls). The
    curve before, 1.2x for 2 and 2.19x for 16, was measured with torch's cuDNN attention, not exact there.

    >>> default_verify_cost("cpu", kernel_isa="avx512")[2], default_verify_cost("cpu", kernel_isa="avxvnni")[2]
    ((5, 1.25), (5, 1.32))
    >>> default_verify_cost("cuda", triton=True), default_verify_cost("cuda", triton=False)[-1]
    ([(1, 1.0), (2, 1.0), (4, 1.0), (8, 1.06), (16, 1.3)], (16, 3.56))
    """
    if device != "cpu":
        if triton is None:
            from verispec.models.triton_attention import available

            triton = available()
        if triton:
            return [(1, 1.0), (2, 1.0), (4, 1.0), (8, 1.06), (16, 1.3)]
        return [(1, 1.0), (2, 1.39), (4, 1.66), (8, 2.32), (16, 3.56)]
    if kernel_isa in ("avx2", "avxvnni"):
        return [(1, 1.0), (2, 1.08), (5, 1.32), (9, 2.1), (16, 3.45)]
    if kernel_isa is not None:
        return [(1, 1.0), (2, 1.05), (5, 1.25), (9, 1.65), (16, 2.9)]
    return [(1, 1.0), (5, 1.05), (9, 1.3)]


def describe_target(dtype: str, kernel_isa: str | None) -> str:
    """'w4a8 target (AVX2 kernel build)': the target's precision, and the kernel build a w4a8 one runs on."""
    build = {"avx512": "AVX-512 VNNI", "avxvnni": "AVX-VNNI", "avx2": "AVX2"}.get(kernel_isa or "", "")
    return f"{dtype} target" + (f" ({build} kernel build)" if dtype.startswith("w4a8") and build else "")


def describe(dtype: str, draft_dtype: str | None, strategy: str, gamma: int, kernel_isa: str | None,
             draft_vocab: int | None = None, draft_context: int | None = None) -> str:
    """The one line a command prints when it runs on defaults it chose for this machine.

    >>> describe("w4a8", "w4a8-4bit", "draft+ngram", 4, "avx2", 65536, 64)
    'verispec: w4a8 target (AVX2 kernel build), w4a8-4bit draft (ids < 65536, first 4 and last 64 prompt tokens), draft+ngram, gamma 4: the fastest exact configuration measured for this CPU (--dtype bfloat16 runs the GGUF dequantized)'
    """
    target = describe_target(dtype, kernel_isa)
    notes = [n for n in (f"ids < {draft_vocab}" if draft_vocab else "",
                         f"first 4 and last {draft_context} prompt tokens" if draft_context else "") if n]
    draft = f", {draft_dtype} draft" + (f" ({', '.join(notes)})" if notes else "") if draft_dtype else ""
    return (f"verispec: {target}{draft}, {strategy}, gamma {gamma}: the fastest exact configuration measured for "
            "this CPU (--dtype bfloat16 runs the GGUF dequantized)")
