"""Run every configuration on the same prompts, interleaved, in one process; ours and peers alike.

A configuration is (system, strategy, gamma, temperature). Each system is a small backend with one method,
`run(config, prompt_ids, max_new_tokens, seed) -> Run`, that times what a streaming user sees: when each
token arrived. Peers (Hugging Face transformers, llama.cpp, OpenVINO GenAI) get the same token ids, the same number of new
tokens and the same end-of-sequence ids, and their sampling is reduced to plain temperature like ours.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from verispec.bench.stats import schedule
from verispec.bench.suite import BenchPrompt
from verispec.models.kernels import cpu_flags


@dataclass(frozen=True)
class Config:
    system: str  # "verispec" | "hf" | "llama.cpp" | "openvino"
    # ours: a verispec strategy; hf: "ar" | "assisted" | "prompt_lookup"; llama.cpp: "ar" | "prompt_lookup" |
    # "draft"; openvino: "ar" | "speculative" | "prompt_lookup"
    strategy: str
    gamma: int  # tokens proposed per round; 0 for plain decoding
    temperature: float

    @property
    def label(self) -> str:
        name = self.strategy if self.system == "verispec" else f"{self.system} {self.strategy}"
        return name + (f" γ={self.gamma}" if self.gamma else "")

    @property
    def plain(self) -> bool:
        return self.strategy == "ar"


@dataclass
class Run:
    """One measured generation. Per-position counts and rounds are None where a peer does not expose them."""

    prompt_id: str
    category: str
    config: Config
    rep: int
    token_ids: list[int]
    seconds: float
    arrivals: list[tuple[float, int]]  # (seconds since start, tokens that arrived then)
    rounds: int | None = None  # target forwards while decoding (one per round)
    drafted: int | None = None
    accepted: int | None = None
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    c: float | None = None
    finish_reason: str | None = None
    rejections: int | None = None  # rounds with a rejected draft (None: a peer, or a record from before it was kept)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0][0] if self.arrivals else None

    def token_latencies(self) -> list[float]:
        """Seconds per token after the first arrival: a gap of g that brought k tokens counts k times g / k."""
        out: list[float] = []
        for (t0, _), (t1, k) in zip(self.arrivals, self.arrivals[1:]):
            out += [(t1 - t0) / k] * k
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id, "category": self.category, "config": self.config.label,
            "system": self.config.system, "strategy": self.config.strategy, "gamma": self.config.gamma,
            "temperature": self.config.temperature, "rep": self.rep, "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 6), "tokens_per_s": round(self.tokens_per_s, 3),
            "ttft_s": None if self.ttft is None else round(self.ttft, 4), "rounds": self.rounds,
            "drafted": self.drafted, "accepted": self.accepted,
            "drafted_per_position": self.drafted_per_position, "accepted_per_position": self.accepted_per_position,
            "c": None if self.c is None else round(self.c, 4), "finish_reason": self.finish_reason,
            "rejections": self.rejections,
            "arrivals": [[round(t, 5), k] for t, k in self.arrivals], "token_ids": self.token_ids,
        }


def run_from_dict(d: dict[str, Any]) -> Run:
    """Inverse of Run.to_dict (for re-rendering a report from its runs)."""
    config = Config(d["system"], d["strategy"], d["gamma"], d["temperature"])
    return Run(
        d["prompt_id"], d["category"], config, d["rep"], list(d["token_ids"]), d["seconds"],
        [(t, k) for t, k in d["arrivals"]], d["rounds"], d["drafted"], d["accepted"],
        list(d["drafted_per_position"]), list(d["accepted_per_position"]), d["c"], d["finish_reason"],
        d.get("rejections"),
    )


class Backend(Protocol):
    def run(self, config: Config, prompt: list[int], max_new_tokens: int, seed: int) -> Run: ...


def _importable(module: str) -> bool:
    """Whether an optional peer's package imports (it is an extra, not a dependency)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def _arrivals(timed: Iterable[tuple[float, list[int]]], limit: int | None = None,
              merge_s: float = 0.0) -> tuple[list[int], list[tuple[float, int]]]:
    """(seconds since start, token chunk) pairs -> (tokens, arrivals), at most `limit` tokens. Arrivals closer than
    merge_s to the previous one are counted with it (a peer that yields the tokens of one verification one by one)."""
    tokens: list[int] = []
    arrivals: list[tuple[float, int]] = []
    for now, chunk in timed:
        if limit is not None:
            chunk = chunk[: limit - len(tokens)]
        if not chunk:
            continue
        tokens += chunk
        if arrivals and now - arrivals[-1][0] < merge_s:
            arrivals[-1] = (arrivals[-1][0], arrivals[-1][1] + len(chunk))
        else:
            arrivals.append((now, len(chunk)))
        if limit is not None and len(tokens) >= limit:
            break
    return tokens, arrivals


def _timed_tokens(chunks: Iterable[list[int]], limit: int | None = None, merge_s: float = 0.0):
    """Drain an iterator of token chunks, timing each as it arrives -> (tokens, arrivals, seconds)."""
    t0 = time.perf_counter()
    tokens, arrivals = _arrivals(((time.perf_counter() - t0, chunk) for chunk in chunks), limit, merge_s)
    return tokens, arrivals, time.perf_counter() - t0


# ---- ours ---------------------------------------------------------------------------------------------------
class VerispecBackend:
    def __init__(self, target, draft, eos_ids: Sequence[int], options=None,
                 synthetic: tuple[float, dict[tuple[int, ...], list[int]]] | None = None) -> None:
        """synthetic: (error rate, the target's greedy output per prompt) to wrap every drafting strategy in
        a SyntheticProposer (speed measurements with random weights)."""
        from verispec.strategies import StrategyOptions

        self.target, self.draft, self.eos_ids = target, draft, tuple(eos_ids)
        self.options = options or StrategyOptions()
        self.synthetic = synthetic

    def run(self, config: Config, prompt: list[int], max_new_tokens: int, seed: int) -> Run:
        from verispec.engine import Generation, GenerationParams, stream
        from verispec.sampling import SamplingParams
        from verispec.strategies import make_proposer

        gamma = max(config.gamma, 1)
        params = GenerationParams(
            max_new_tokens=max_new_tokens, gamma=gamma, sampling=SamplingParams(temperature=config.temperature),
            seed=seed, eos_ids=self.eos_ids,
        )
        proposer = make_proposer(
            config.strategy, self.target, self.draft, len(prompt) + max_new_tokens + gamma + 2, self.options
        )
        if proposer is not None and self.synthetic is not None:
            from verispec.proposers.synthetic import SyntheticProposer

            error_rate, references = self.synthetic
            proposer = SyntheticProposer(proposer, references[tuple(prompt)], error_rate,
                                         self.target.model.vocab_size, seed=seed, prompt_len=len(prompt))
        result = Generation()
        tokens, arrivals, seconds = _timed_tokens(stream(self.target.model, prompt, params, proposer, result=result))
        m = result.metrics
        return Run(
            prompt_id="", category="", config=config, rep=0, token_ids=tokens, seconds=seconds, arrivals=arrivals,
            rounds=m.rounds, drafted=m.drafted if proposer else None, accepted=m.accepted if proposer else None,
            drafted_per_position=m.drafted_per_position, accepted_per_position=m.accepted_per_position,
            c=m.c, finish_reason=result.finish_reason, rejections=m.rejections if proposer else None,
        )


# ---- Hugging Face transformers ------------------------------------------------------------------------------
class HFBackend:
    """transformers' own `generate`: plain, and assisted generation with the draft as `assistant_model`.

    The models load from the same converted directories as ours, in the same dtype (bfloat16 unless told).
    """

    def __init__(self, target_dir, draft_dir, eos_ids: Sequence[int], pad_id: int | None, dtype: torch.dtype,
                 ngram_max: int = 3) -> None:
        self.target_dir, self.draft_dir, self.dtype, self.ngram_max = target_dir, draft_dir, dtype, ngram_max
        self.eos_ids, self.pad_id = list(eos_ids), pad_id
        self._models: dict[str, Any] = {}

    def _model(self, path) -> Any:
        from transformers import AutoModelForCausalLM

        key = str(path)
        if key not in self._models:
            self._models[key] = AutoModelForCausalLM.from_pretrained(key, dtype=self.dtype).eval()
        return self._models[key]

    def run(self, config: Config, prompt: list[int], max_new_tokens: int, seed: int) -> Run:
        from transformers import GenerationConfig
        from transformers.generation.streamers import BaseStreamer

        model = self._model(self.target_dir)
        sampled = config.temperature > 0
        gen = GenerationConfig(
            max_new_tokens=max_new_tokens, do_sample=sampled, temperature=config.temperature if sampled else None,
            top_k=None, top_p=None, min_p=None, repetition_penalty=None, eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
        )
        kwargs: dict[str, Any] = {}
        if config.strategy == "assisted":
            if self.draft_dir is None:
                raise ValueError("hf assisted generation needs a draft model")
            gen.num_assistant_tokens = config.gamma
            gen.num_assistant_tokens_schedule = "constant"
            gen.assistant_confidence_threshold = 0.0  # draft exactly gamma tokens, as our rounds do
            kwargs["assistant_model"] = self._model(self.draft_dir)
        elif config.strategy == "prompt_lookup":
            gen.prompt_lookup_num_tokens = config.gamma
            gen.max_matching_ngram_size = self.ngram_max
        elif config.strategy != "ar":
            raise ValueError(f"unknown hf strategy {config.strategy!r}")

        chunks: list[tuple[float, list[int]]] = []
        t0 = time.perf_counter()

        class Timer(BaseStreamer):
            first = True

            def put(self, value: torch.Tensor) -> None:
                if self.first:  # generate() hands the prompt over first
                    self.first = False
                    return
                chunks.append((time.perf_counter() - t0, value.reshape(-1).tolist()))

            def end(self) -> None:
                pass

        torch.manual_seed(seed)
        ids = torch.tensor([prompt], dtype=torch.long)
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gen, streamer=Timer(), **kwargs)
        seconds = time.perf_counter() - t0
        tokens = [t for _, c in chunks for t in c]
        finish = "eos" if tokens and tokens[-1] in self.eos_ids else "length"
        if finish == "eos":
            tokens = tokens[:-1]  # ours does not count the end-of-sequence token as output
        arrivals = [(t, len(c)) for t, c in chunks if c]
        return Run(
            prompt_id="", category="", config=config, rep=0, token_ids=tokens, seconds=seconds,
            # transformers' streamer is not called once per verification in assisted generation (its chunks
            # gave 6.7 tokens each at gamma 2), so only plain decoding's rounds are known.
            arrivals=arrivals, rounds=len(chunks) if config.strategy == "ar" else None, finish_reason=finish,
        )


# ---- llama.cpp ----------------------------------------------------------------------------------------------
LLAMA_CPP_HINT = (
    "llama.cpp peer skipped: llama-cpp-python is not installed (pip install llama-cpp-python; it compiles "
    "llama.cpp, ~10 min on 2 cores)"
)


class LlamaCppDraft:
    """llama.cpp's draft-model speculation as its Python binding allows it: a second llama.cpp model (the draft
    GGUF) proposes `gamma` greedy tokens a round, keeping its KV cache across rounds (it re-reads only what the
    target's round changed); the binding's generate() verifies them in one batch and keeps the prefix its own
    sampler agrees with (the rule of llama.cpp's speculative example; its kernels round a batch differently from
    one token, so its greedy output can differ from its plain decoding). `llm` is a llama_cpp.Llama."""

    def __init__(self, llm: Any, gamma: int) -> None:
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.llm, self.gamma = llm, gamma

    def __call__(self, input_ids: Any, /, **kwargs: Any) -> Any:
        import numpy as np

        llm, ids = self.llm, np.asarray(input_ids)
        n = min(llm.n_tokens, len(ids) - 1)  # the cached tokens that may be kept: >= 1 is re-read, for its logits
        differ = np.flatnonzero(llm.input_ids[:n] != ids[:n])
        keep = int(differ[0]) if differ.size else n
        llm.n_tokens = keep  # eval() drops the cache past n_tokens before it reads
        llm.eval(ids[keep:].tolist())
        drafted: list[int] = []
        for i in range(self.gamma):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))  # the last token's
            drafted.append(int(np.argmax(logits)))
            if i + 1 < self.gamma:
                llm.eval(drafted[-1:])
        return np.array(drafted, dtype=np.intc)


class LlamaCppBackend:
    """llama-cpp-python on the same GGUF file: plain decoding, its prompt-lookup drafting, and (given the draft's
    GGUF) draft-model speculation (LlamaCppDraft)."""

    def __init__(self, gguf_path, eos_ids: Sequence[int], threads: int, n_ctx: int = 4096,
                 draft_path=None) -> None:
        self.path, self.eos_ids, self.threads, self.n_ctx = str(gguf_path), set(eos_ids), threads, n_ctx
        self.draft_path = None if draft_path is None else str(draft_path)
        self._llms: dict[tuple[str, int], Any] = {}

    @staticmethod
    def available() -> bool:
        return _importable("llama_cpp")

    def _llm(self, strategy: str, gamma: int) -> Any:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        if (strategy, gamma) not in self._llms:
            import llama_cpp.llama_cpp as lib

            draft: Any = None
            if strategy == "prompt_lookup":
                draft = LlamaPromptLookupDecoding(num_pred_tokens=gamma)
            elif strategy == "draft":
                if self.draft_path is None:
                    raise ValueError("llama.cpp draft-model speculation needs the draft model's GGUF file")
                draft_llm = Llama(model_path=self.draft_path, n_ctx=self.n_ctx, n_threads=self.threads,
                                  n_threads_batch=self.threads, verbose=False)
                draft = LlamaCppDraft(draft_llm, gamma)  # the binding calls it; it checks no type
            # llama.cpp's AMX weight repacking ("extra buffer types") crashes in llama_decode on AMX CPUs (with
            # llama-cpp-python 0.3.36: a segmentation fault on one Xeon VM kind, an illegal instruction on another,
            # benchmarks/results/2026-12-06-xeon-amx-llamacpp-builds); its AVX-512 kernels run fine.
            # Elsewhere, and in a build without AMX (GGML_NATIVE=OFF with the AVX-512 flags), the repacked layouts
            # are its fastest (on that Xeon a build without AMX decodes at 69 ms a token with them, 85 without),
            # so only an AMX build on an AMX CPU gets them switched off. Llama() reads the default model params,
            # so that one flag is switched off while it is built.
            defaults = lib.llama_model_default_params
            amx = "amx_tile" in cpu_flags() and "AMX_INT8 = 1" in lib.llama_print_system_info().decode()

            def no_repack():
                params = defaults()
                params.use_extra_bufts = not amx
                return params

            lib.llama_model_default_params = no_repack
            try:
                # logits_all with a draft: llama-cpp-python (0.3.36) keeps every position's logits then, but sizes
                # their array from this flag, so without it a prompt + output past n_batch (512) tokens overflows
                # it (a broadcast error); the array is not written (so not resident) beyond the tokens used
                self._llms[strategy, gamma] = Llama(
                    model_path=self.path, n_ctx=self.n_ctx, n_threads=self.threads, n_threads_batch=self.threads,
                    draft_model=draft, logits_all=draft is not None, verbose=False,
                )
            finally:
                lib.llama_model_default_params = defaults
        return self._llms[strategy, gamma]

    def run(self, config: Config, prompt: list[int], max_new_tokens: int, seed: int) -> Run:
        if config.strategy not in ("ar", "prompt_lookup", "draft"):
            raise ValueError(f"unknown llama.cpp strategy {config.strategy!r}")
        llm = self._llm(config.strategy, 0 if config.plain else config.gamma)
        llm.set_seed(seed)
        llm.reset()
        finish = "length"

        def tokens() -> Iterable[list[int]]:
            nonlocal finish
            it = llm.generate(
                prompt, temp=config.temperature, top_k=0, top_p=1.0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0,
                reset=True,
            )
            for tok in it:
                if tok in self.eos_ids:
                    finish = "eos"
                    return
                yield [tok]

        toks, arrivals, seconds = _timed_tokens(tokens(), limit=max_new_tokens, merge_s=0.002)
        return Run(
            prompt_id="", category="", config=config, rep=0, token_ids=toks, seconds=seconds, arrivals=arrivals,
            finish_reason=finish,
        )


# ---- OpenVINO GenAI ------------------------------------------------------------------------------------------
OPENVINO_HINT = (
    "openvino peer skipped: openvino-genai is not installed (pip install -e '.[openvino]')"
)
OPENVINO_STRATEGIES = ("ar", "speculative", "prompt_lookup")


class OpenVinoBackend:
    """OpenVINO GenAI, Intel's CPU runtime, on the pair as optimum-intel exports it (int4 weights; made once by
    benchmarks/openvino_export.sh): plain decoding, its speculative decoding with the draft, and its prompt lookup.
    The prompt goes in as our token ids; sampling is plain temperature, seeded per run as ours is."""

    def __init__(self, target_dir, draft_dir, eos_ids: Sequence[int], threads: int, ngram_max: int = 3) -> None:
        self.target_dir, self.draft_dir = str(target_dir), None if draft_dir is None else str(draft_dir)
        self.eos_ids, self.threads, self.ngram_max = set(eos_ids), threads, ngram_max
        self._pipes: dict[str, Any] = {}

    @staticmethod
    def available() -> bool:
        return _importable("openvino_genai")

    def _pipe(self, strategy: str) -> Any:
        import openvino_genai as ov_genai

        if strategy not in self._pipes:
            threads = {"INFERENCE_NUM_THREADS": self.threads}
            # its pipelines run on a continuous-batching scheduler that caches prompt prefixes by default; a bench
            # runs each prompt once per configuration and temperature, so the cache would hand the later runs a
            # free prefill (0.05-0.13 s against 0.65-0.7 s for 110 tokens): off, as ours has none
            extra: dict[str, Any] = {"scheduler_config": ov_genai.SchedulerConfig()}
            if strategy == "speculative":
                if self.draft_dir is None:
                    raise ValueError("openvino speculative decoding needs an exported draft model")
                extra["draft_model"] = ov_genai.draft_model(self.draft_dir, "CPU", **threads)
            elif strategy == "prompt_lookup":
                extra["prompt_lookup"] = True
            self._pipes[strategy] = ov_genai.LLMPipeline(self.target_dir, "CPU", **extra, **threads)
        return self._pipes[strategy]

    def run(self, config: Config, prompt: list[int], max_new_tokens: int, seed: int) -> Run:
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai

        if config.strategy not in OPENVINO_STRATEGIES:
            raise ValueError(f"unknown openvino strategy {config.strategy!r}")
        pipe = self._pipe(config.strategy)
        gen = pipe.get_generation_config()
        gen.max_new_tokens = max_new_tokens
        gen.stop_token_ids = self.eos_ids
        gen.do_sample = config.temperature > 0
        if gen.do_sample:
            gen.temperature, gen.top_p, gen.rng_seed = config.temperature, 1.0, seed
        gen.repetition_penalty = 1.0
        if config.strategy != "ar":
            gen.num_assistant_tokens = max(config.gamma, 1)
        if config.strategy == "prompt_lookup":
            gen.max_ngram_size = self.ngram_max
        chunks: list[tuple[float, list[int]]] = []

        class Timer(ov_genai.StreamerBase):  # called as tokens are accepted: one chunk per round or per token
            def write(self, token) -> Any:
                chunks.append((time.perf_counter() - t0, [int(t) for t in (token if isinstance(token, list) else [token])]))
                return ov_genai.StreamingStatus.RUNNING

            def end(self) -> None:
                pass

        ids = np.array([prompt], dtype=np.int64)
        inputs = ov_genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        for attempt in range(2):
            chunks.clear()
            t0 = time.perf_counter()
            try:
                pipe.generate(inputs, gen, Timer())
                break
            except RuntimeError:
                # openvino-genai 2026.4.1: a pipeline's first sampled speculative generation of more than a few
                # tokens fails a check ("content_length <= prompt_ids.size() + m_generated_ids.size()",
                # sequence_group.cpp) on any seed, and the same call then runs; a second failure is reported
                if attempt or not (gen.do_sample and config.strategy == "speculative"):
                    raise
        seconds = time.perf_counter() - t0
        finish = "length"

        def until_eos() -> Iterable[tuple[float, list[int]]]:  # ours does not count the end-of-sequence token
            nonlocal finish
            for at, chunk in chunks:
                kept = list(itertools.takewhile(lambda t: t not in self.eos_ids, chunk))
                finish = "eos" if len(kept) < len(chunk) else finish
                yield at, kept
                if finish == "eos":
                    return

        tokens, arrivals = _arrivals(until_eos(), limit=max_new_tokens, merge_s=0.002)
        return Run(
            prompt_id="", category="", config=config, rep=0, token_ids=tokens, seconds=seconds, arrivals=arrivals,
            finish_reason=finish,
        )


# ---- the run ------------------------------------------------------------------------------------------------
@dataclass
class BenchRun:
    runs: list[Run]
    interrupted: bool = False
    errors: list[str] = field(default_factory=list)


def run_bench(
    prompts: Sequence[BenchPrompt],
    encode: Callable[[BenchPrompt], list[int]],
    configs: Sequence[Config],
    backends: dict[str, Backend],
    *,
    max_new_tokens: int,
    repeats: int = 1,
    seed: int = 0,
    warmup: bool = True,
    progress: bool = True,
    on_run: Callable[[Run], None] | None = None,
) -> BenchRun:
    """Every configuration on every prompt, interleaved; Ctrl-C stops and returns what was measured."""
    from tqdm import tqdm

    out = BenchRun(runs=[])
    ids = [encode(p) for p in prompts]
    order = schedule(len(prompts), len(configs), repeats)
    try:
        if warmup and prompts:  # first calls pay for lazy loading, allocator growth, kernel selection
            for config in tqdm(configs, desc="warm-up", disable=not progress, file=sys.stderr, leave=False):
                backends[config.system].run(config, ids[0], min(8, max_new_tokens), seed)
        bar = tqdm(order, desc="bench", unit="run", disable=not progress, file=sys.stderr)
        for p, rep, c in bar:
            config, prompt = configs[c], prompts[p]
            bar.set_postfix_str(f"{prompt.id} {config.label} T={config.temperature}")
            try:
                run = backends[config.system].run(config, ids[p], max_new_tokens, seed + 1000 * rep + p)
            except (RuntimeError, ValueError) as e:  # one failing peer must not lose the whole bench
                out.errors.append(f"{config.label} T={config.temperature} on {prompt.id}: {e}")
                continue
            run.prompt_id, run.category, run.rep = prompt.id, prompt.category, rep
            out.runs.append(run)
            if on_run is not None:
                on_run(run)
    except KeyboardInterrupt:
        out.interrupted = True
    return out
