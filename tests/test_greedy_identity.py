"""Greedy speculative decoding is token-for-token identical to plain greedy decoding; stop conditions are exact.

float32 tiny models, as the engine runs them. (Speculative verification scores a chunk of tokens in one forward
while plain decoding scores one at a time; the two round differently at the 1e-6 level, so an exact logit tie
could in principle flip an argmax. The fixed random models here have no such near-ties; the float64 variant of
the self-draft test removes even that possibility.)
"""

from __future__ import annotations

import copy
import random

import pytest
import torch

from verispec.engine import Generation, GenerationParams, generate, stream
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
GAMMAS = [1, 2, 4, 7]
MAX_NEW = 24


def prompts(vocab: int, count: int = 32, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 20] + [rng.randint(1, 20) for _ in range(count - 3)]
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


def plain(target, prompt, max_new=MAX_NEW, **kw) -> Generation:
    return generate(target, prompt, GenerationParams(max_new_tokens=max_new, sampling=GREEDY, **kw))


def spec(target, draft, prompt, gamma, max_new=MAX_NEW, eos_ids=()) -> Generation:
    proposer = DraftModelProposer(draft, len(prompt) + max_new + gamma + 2)
    params = GenerationParams(max_new_tokens=max_new, gamma=gamma, sampling=GREEDY, eos_ids=eos_ids)
    return generate(target, prompt, params, proposer)


@pytest.fixture(scope="module")
def plain_outputs(wide_target):
    return {tuple(p): plain(wide_target, p).token_ids for p in prompts(wide_target.vocab_size)}


@pytest.mark.parametrize("gamma", GAMMAS)
def test_speculative_greedy_equals_plain_greedy(wide_target, wide_draft, plain_outputs, gamma):
    accepted = drafted = 0
    for prompt, expected in plain_outputs.items():
        res = spec(wide_target, wide_draft, list(prompt), gamma)
        assert res.token_ids == expected, (prompt, gamma)
        assert res.finish_reason == "length"
        accepted += res.metrics.accepted
        drafted += res.metrics.drafted
    alpha = accepted / drafted
    print(f"\ngreedy gamma={gamma}: alpha={alpha:.3f}")
    assert 0.2 < alpha < 0.95  # the draft really is wrong sometimes: rejections and rollbacks happen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("gamma", GAMMAS)
def test_self_draft_accepts_everything(wide_target, dtype, gamma):
    """Draft == target: every draft is accepted (alpha exactly 1) and every round but the first (a plain step while
    the draft has not started) and the last emits gamma + 1."""
    target = wide_target if dtype == torch.float32 else copy.deepcopy(wide_target).to(dtype)
    draft = copy.deepcopy(target)
    for prompt in prompts(target.vocab_size, count=8, seed=1):
        proposer = DraftModelProposer(draft, len(prompt) + MAX_NEW + gamma + 2)
        result = Generation()
        chunks = list(stream(target, prompt, GenerationParams(max_new_tokens=MAX_NEW, gamma=gamma, sampling=GREEDY),
                             proposer, result=result))
        m = result.metrics
        assert m.alpha == 1.0 and m.accepted == m.drafted
        assert len(chunks[0]) == 1 and [len(c) for c in chunks[1:-1]] == [gamma + 1] * (len(chunks) - 2)
        assert 1 <= len(chunks[-1]) <= gamma + 1
        rounds = 1 + -(-(MAX_NEW - 1) // (gamma + 1))
        assert m.rounds == rounds and m.mean_accepted_length == MAX_NEW / rounds
        assert sum(chunks, []) == result.token_ids == plain(target, prompt).token_ids


@pytest.mark.parametrize("gamma", [None, 1, 4, 7])
def test_eos_stops_and_is_excluded(wide_target, wide_draft, plain_outputs, gamma):
    positions = set()
    for prompt, expected in list(plain_outputs.items())[:12]:
        for eos, idx in {(expected[i], expected.index(expected[i])) for i in (0, 3, 9, 17)}:
            kw = {"eos_ids": (eos, 31 if eos != 31 else 30)}
            # Use an extra eos id that never appears before idx, to exercise the tuple.
            if kw["eos_ids"][1] in expected[:idx]:
                kw = {"eos_ids": (eos,)}
            if gamma is None:
                res = plain(wide_target, list(prompt), **kw)
            else:
                res = spec(wide_target, wide_draft, list(prompt), gamma, **kw)
            assert res.token_ids == expected[:idx], (prompt, eos, idx)
            assert res.finish_reason == "eos"
            assert res.metrics.new_tokens == idx
            positions.add(idx)
    assert 0 in positions and max(positions) >= 9  # EOS as the very first token and deep into the text


@pytest.mark.parametrize("gamma", [None, 1, 3, 7])
@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 8, 13])
def test_max_new_tokens_exact(wide_target, wide_draft, plain_outputs, gamma, max_new):
    for prompt, expected in list(plain_outputs.items())[:5]:
        if gamma is None:
            res = plain(wide_target, list(prompt), max_new=max_new)
        else:
            res = spec(wide_target, wide_draft, list(prompt), gamma, max_new=max_new)
        assert res.token_ids == expected[:max_new]
        assert res.finish_reason == "length" and res.metrics.new_tokens == max_new


def run_stop(target, draft, prompt, gamma, stop_fn) -> tuple[Generation, list[list[int]]]:
    result = Generation()
    if gamma is None:
        params = GenerationParams(max_new_tokens=MAX_NEW, sampling=GREEDY)
        chunks = list(stream(target, prompt, params, result=result, stop_fn=stop_fn))
    else:
        params = GenerationParams(max_new_tokens=MAX_NEW, gamma=gamma, sampling=GREEDY)
        proposer = DraftModelProposer(draft, len(prompt) + MAX_NEW + gamma + 2)
        chunks = list(stream(target, prompt, params, proposer, result=result, stop_fn=stop_fn))
    return result, chunks


@pytest.mark.parametrize("gamma", [None, 1, 4, 7])
def test_stop_fn_truncates_after_a_stop_sequence(wide_target, wide_draft, plain_outputs, gamma):
    """stop_fn sees all new ids so far and returns how many to keep. A two-token stop sequence kept in the output,
    which may straddle two rounds."""
    for prompt, expected in list(plain_outputs.items())[:12]:
        for start in (2, 7, 15):
            stop_seq = expected[start : start + 2]
            first = next(i for i in range(len(expected) - 1) if expected[i : i + 2] == stop_seq)

            def stop_fn(ids: list[int], stop_seq=stop_seq) -> int | None:
                hits = [i for i in range(len(ids) - 1) if ids[i : i + 2] == stop_seq]
                return hits[0] + 2 if hits else None

            result, chunks = run_stop(wide_target, wide_draft, list(prompt), gamma, stop_fn)
            assert result.token_ids == expected[: first + 2], (prompt, stop_seq)
            assert sum(chunks, []) == result.token_ids
            assert result.finish_reason == "stop" and result.metrics.new_tokens == first + 2


@pytest.mark.parametrize("gamma", [None, 1, 4, 7])
def test_stop_fn_can_drop_the_stop_token(wide_target, wide_draft, plain_outputs, gamma):
    """A one-token stop sequence excluded from the output: the cut may fall in the middle of a round."""
    for prompt, expected in list(plain_outputs.items())[:12]:
        for pos in (0, 5, 13):
            stop_tok = expected[pos]
            first = expected.index(stop_tok)

            def stop_fn(ids: list[int], stop_tok=stop_tok) -> int | None:
                return ids.index(stop_tok) if stop_tok in ids else None

            result, chunks = run_stop(wide_target, wide_draft, list(prompt), gamma, stop_fn)
            assert result.token_ids == expected[:first], (prompt, stop_tok)
            assert sum(chunks, []) == result.token_ids
            assert result.finish_reason == "stop"


def test_generation_params_validation(wide_target):
    with pytest.raises(ValueError):
        GenerationParams(max_new_tokens=0)
    with pytest.raises(ValueError):
        GenerationParams(gamma=0)
    with pytest.raises(ValueError):
        generate(wide_target, [], GenerationParams(max_new_tokens=2, sampling=GREEDY))
    too_long = wide_target.cfg.max_position_embeddings
    with pytest.raises(ValueError):
        generate(wide_target, [1] * too_long, GenerationParams(max_new_tokens=2, sampling=GREEDY))


class CountingModel:
    def __init__(self, model) -> None:
        self.model, self.calls = model, 0
        self.vocab_size, self.device, self.dtype = model.vocab_size, model.device, model.dtype

    def new_cache(self, max_len: int, batch: int = 1):
        return self.model.new_cache(max_len, batch)

    def forward(self, tokens, cache, *, last_n=None):
        self.calls += 1
        return self.model.forward(tokens, cache, last_n=last_n)


@pytest.mark.parametrize("prompt", [[3], [3, 1, 4]], ids=["1-token-prompt", "3-token-prompt"])
@pytest.mark.parametrize("gamma", [None, 3])
def test_metrics_count_forwards(wide_target, wide_draft, prompt, gamma):
    """rounds = decoding forwards of the target; target_forwards in the report = every target forward, prefill
    included (a one-token prompt has no prefill forward)."""
    counted = CountingModel(wide_target)
    if gamma is None:
        res = generate(counted, prompt, GenerationParams(max_new_tokens=10, sampling=GREEDY))
    else:
        res = generate(counted, prompt, GenerationParams(max_new_tokens=10, gamma=gamma, sampling=GREEDY),
                       DraftModelProposer(wide_draft, 32))
    m = res.metrics
    prefill = 1 if len(prompt) > 1 else 0
    assert m.rounds == counted.calls - prefill
    assert m.new_tokens == 10 and m.mean_accepted_length == 10 / m.rounds
    assert m.to_dict()["target_forwards"] == counted.calls


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_round_profile_accounts_for_the_decode_time(wide_target, wide_draft, temperature):
    proposer = DraftModelProposer(wide_draft, 64)
    params = GenerationParams(max_new_tokens=MAX_NEW, gamma=3, sampling=SamplingParams(temperature=temperature))
    res = generate(wide_target, [1, 2, 3, 4], params, proposer)
    m = res.metrics
    prof = m.profile()
    assert prof is not None and all(v >= 0 for v in prof.values()), prof
    assert prof["draft_ms"] > 0 and prof["target_ms"] > 0 and prof["verify_ms"] > 0
    assert m.proposer_prefill_seconds > 0  # the draft's prefill of the 4-token prompt, not a round's time
    decode_ms = (m.seconds - m.prefill_seconds - m.proposer_prefill_seconds) * 1e3 / m.rounds
    assert sum(prof.values()) == pytest.approx(decode_ms, abs=0.05)
    assert m.to_dict()["round_profile"] == prof
