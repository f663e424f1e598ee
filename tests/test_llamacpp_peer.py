"""The llama.cpp peer's draft-model speculation (LlamaCppDraft) against a stand-in for llama_cpp.Llama: what it
re-reads each round and what it proposes; and, where llama-cpp-python is installed, on the real pair (greedy
draft-model speculation gives llama.cpp's own plain output). llama-cpp-python is never installed by CI (it compiles
llama.cpp), so that test runs only where a developer installed it for benchmarks."""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np
import pytest

from verispec.bench.runner import Config, LlamaCppDraft
from verispec.cli.bench import build_configs, parse_gammas, parse_peer_gammas

VOCAB = 10


class FakeLlama:
    """What LlamaCppDraft uses of llama_cpp.Llama: a token cache (input_ids, n_tokens: eval drops what lies past
    n_tokens, then appends), and the last evaluated token's logits, here peaked at (token + 1) % VOCAB."""

    def __init__(self) -> None:
        self.input_ids = np.zeros(64, dtype=np.intc)
        self.n_tokens = 0
        self.evals: list[list[int]] = []
        self._ctx = self
        self._logits = (ctypes.c_float * VOCAB)()

    def n_vocab(self) -> int:
        return VOCAB

    def eval(self, tokens: list[int]) -> None:
        assert tokens, "eval of no tokens leaves no logits"
        self.evals.append(list(tokens))
        self.input_ids[self.n_tokens: self.n_tokens + len(tokens)] = tokens
        self.n_tokens += len(tokens)
        for i in range(VOCAB):
            self._logits[i] = 1.0 if i == (tokens[-1] + 1) % VOCAB else 0.0

    def get_logits(self):
        return ctypes.cast(self._logits, ctypes.POINTER(ctypes.c_float))


def test_the_draft_rereads_only_what_the_round_changed() -> None:
    llm = FakeLlama()
    draft = LlamaCppDraft(llm, gamma=3)
    assert draft(np.array([5, 1, 2], dtype=np.intc)).tolist() == [3, 4, 5]  # greedy: each token's successor
    assert llm.evals == [[5, 1, 2], [3], [4]]  # the prompt, then each draft but the last (never needed)
    # the target accepted 3 and 4, then sampled 7: the draft keeps [5, 1, 2, 3, 4] and reads 7 alone
    llm.evals.clear()
    assert draft(np.array([5, 1, 2, 3, 4, 7], dtype=np.intc)).tolist() == [8, 9, 0]
    assert llm.evals == [[7], [8], [9]] and llm.n_tokens == 8
    # the target rejected the first draft: the cache holds 7, 8, 9 past the agreed prefix; they are dropped
    llm.evals.clear()
    assert draft(np.array([5, 1, 2, 3, 4, 7, 2], dtype=np.intc)).tolist() == [3, 4, 5]
    assert llm.evals == [[2], [3], [4]] and llm.input_ids[:7].tolist() == [5, 1, 2, 3, 4, 7, 2]
    # the same sequence again (all cached): its last token is read again, for its logits
    llm.evals.clear()
    draft(np.array([5, 1, 2, 3, 4, 7, 2, 3, 4], dtype=np.intc))
    assert llm.evals[0] == [4]
    with pytest.raises(ValueError, match="gamma"):
        LlamaCppDraft(llm, gamma=0)


def test_llamacpp_draft_configs_run_beside_drafting_strategies_only() -> None:
    def labels(strategies: list[str]) -> list[str]:
        return [c.label for c in build_configs(strategies, [2, 4], [0.0], ["llama.cpp"]) if c.system == "llama.cpp"]

    assert labels(["auto"]) == ["llama.cpp ar", "llama.cpp prompt_lookup γ=2", "llama.cpp prompt_lookup γ=4",
                                "llama.cpp draft γ=2", "llama.cpp draft γ=4"]
    assert labels(["ngram"]) == ["llama.cpp ar", "llama.cpp prompt_lookup γ=2", "llama.cpp prompt_lookup γ=4"]


def test_the_peers_runs_can_be_narrowed_to_some_configurations_and_gammas() -> None:
    def labels(peers: list[str], gammas: list[int] | None, names: list[str] | None) -> list[str]:
        return [c.label for c in build_configs(["auto"], [6], [0.0, 0.7], peers, gammas, names)]

    ours = ["ar", "auto γ=6"]
    narrowed = ["llama.cpp ar", "llama.cpp prompt_lookup γ=2"]
    assert labels(["llama.cpp"], [2], ["ar", "prompt_lookup"]) == ours + narrowed + ours + narrowed
    assert labels(["llama.cpp"], [2, 4], None)[2:7] == ["llama.cpp ar", "llama.cpp prompt_lookup γ=2",
                                                        "llama.cpp prompt_lookup γ=4", "llama.cpp draft γ=2",
                                                        "llama.cpp draft γ=4"]
    assert labels(["llama.cpp"], None, None)[2:5] == ["llama.cpp ar", "llama.cpp prompt_lookup γ=6",
                                                      "llama.cpp draft γ=6"]
    # a name no chosen peer has selects nothing of theirs; each peer keeps its own order
    assert labels(["llama.cpp", "openvino"], [2], ["draft", "speculative"])[:4] == \
        ours + ["llama.cpp draft γ=2", "openvino speculative γ=2"]
    assert labels(["hf"], [2], ["speculative"]) == ours + ours
    # each peer its own gammas: llama.cpp's prompt lookup at 2, OpenVINO's speculation at 4
    both = build_configs(["auto"], [6], [0.0], ["llama.cpp", "openvino"],
                         parse_peer_gammas("2,openvino:4", ["llama.cpp", "openvino"], [6]), ["ar", "prompt_lookup",
                                                                                               "speculative"])
    assert [c.label for c in both] == ours + ["llama.cpp ar", "llama.cpp prompt_lookup γ=2", "openvino ar",
                                              "openvino speculative γ=4", "openvino prompt_lookup γ=4"]
    # a peer not named takes the bare numbers, or --gamma's when there are none
    assert parse_peer_gammas("openvino:4,openvino:5", ["llama.cpp", "openvino"], [6]) == {"llama.cpp": [6],
                                                                                          "openvino": [4, 5]}


def test_each_strategy_runs_at_its_own_gammas_and_the_peers_at_the_bare_ones() -> None:
    strategies = ["ar", "draft", "eagle", "draft+ngram"]
    per, peers = parse_gammas("4,eagle:2,eagle:3,draft+ngram:6", strategies)
    assert per == {"draft": [4], "eagle": [2, 3], "draft+ngram": [6]} and peers == [4]
    labels = [c.label for c in build_configs(strategies, per, [0.0], ["llama.cpp"], peers, ["ar", "prompt_lookup"])]
    assert labels == ["ar", "draft γ=4", "eagle γ=2", "eagle γ=3", "draft+ngram γ=6", "llama.cpp ar",
                      "llama.cpp prompt_lookup γ=4"]
    # no bare number: every strategy named, the peers at every gamma named; one list for all is the old form
    per, peers = parse_gammas("eagle:2,draft:4", ["draft", "eagle"])
    assert per == {"draft": [4], "eagle": [2]} and peers == [2, 4]
    assert [c.label for c in build_configs(["draft", "eagle"], per, [0.0], [])] == ["ar", "draft γ=4", "eagle γ=2"]
    assert [c.label for c in build_configs(["draft", "eagle"], [2, 4], [0.0], [])] == \
        ["ar", "draft γ=2", "draft γ=4", "eagle γ=2", "eagle γ=4"]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (a benchmark peer: it compiles llama.cpp)")
def test_llamacpp_greedy_draft_speculation_gives_its_plain_output() -> None:
    from verispec.bench.runner import LlamaCppBackend
    from verispec.cli.bench import _gguf_path

    target, draft = _gguf_path("qwen2.5-coder-1.5b-instruct"), _gguf_path("qwen2.5-coder-0.5b-instruct")
    backend = LlamaCppBackend(target, [151645, 151643], threads=2, n_ctx=512, draft_path=draft)
    text = "<|im_start|>user\nWrite a Python function that merges two sorted lists.<|im_end|>\n<|im_start|>assistant\n"
    prompt = backend._llm("ar", 0).tokenize(text.encode(), add_bos=False, special=True)
    plain = backend.run(Config("llama.cpp", "ar", 0, 0.0), prompt, 48, 0).token_ids
    assert len(plain) == 48
    for gamma in (1, 4):
        assert backend.run(Config("llama.cpp", "draft", gamma, 0.0), prompt, 48, 0).token_ids == plain
