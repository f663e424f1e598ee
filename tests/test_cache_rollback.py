"""KV-cache commit/rollback: after any round, the caches of the target and of the draft model hold exactly the
accepted text, so the next logits equal those of a fresh prefill (float32, atol 1e-5).

Three levels: KVCache unit tests; rounds driven by hand exactly as the engine and DraftModelProposer drive them
(rejection at 0, in the middle, all accepted, many rounds); and the real engine with spies around both models
that check EVERY forward against a fresh prefill of the text the cache claims to hold.
"""

from __future__ import annotations

import copy
import dataclasses
import random

import pytest
import torch

from tests.conftest import fresh_logits
from verispec.cache import CacheFullError, KVCache
from verispec.engine import GenerationParams, generate
from verispec.models.llama import LlamaModel
from verispec.proposers.base import Outcome, Proposal, SequenceProposer
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams
from verispec.verify import verify_chain

GREEDY = SamplingParams(temperature=0.0)


def forward(model, tokens: list[int], cache: KVCache, last_n: int | None = None) -> torch.Tensor:
    return model.forward(torch.tensor([tokens], dtype=torch.long), cache, last_n=last_n)[0]


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    """float64 models: 1e-9 (a stale or misplaced slot changes logits by ~0.1-1). float32: 4e-5 relative to the
    logit scale -- the same text through different matmul shapes (1 token vs a prefill) rounds differently, by up
    to ~1.5e-5 on logits of magnitude ~8 and ~2.6e-5 on logits of magnitude ~1.6 (a draft prefilled one token
    later)."""
    tol = 1e-9 if a.dtype == torch.float64 else 4e-5 * max(1.0, b.abs().max().item())
    err = (a - b).abs().max().item()
    assert err < tol, f"max |diff| = {err:.3g} (tol {tol:.3g})"


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["f32", "f64"])
def target(request, wide_target):
    return copy.deepcopy(wide_target).to(request.param)


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["f32", "f64"])
def draft(request, wide_draft):
    return copy.deepcopy(wide_draft).to(request.param)


# ---- KVCache unit tests -------------------------------------------------------------------------------------------
def make_cache(max_len: int = 8) -> KVCache:
    return KVCache(n_layers=2, n_kv_heads=1, head_dim=2, max_len=max_len)


def kv(t: int, value: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.full((1, 1, t, 2), value)
    return x, -x


def test_write_goes_after_the_committed_prefix_and_returns_visible_slots():
    c = make_cache()
    k_all, _ = c.write(0, *kv(3, 1.0))
    assert k_all.shape == (1, 1, 3, 2) and c.length == 0  # a forward commits nothing
    c.commit(2)
    k_all, v_all = c.write(0, *kv(2, 2.0))  # overwrites the uncommitted slot 2
    assert k_all.shape == (1, 1, 4, 2)
    assert k_all[0, 0, :, 0].tolist() == [1.0, 1.0, 2.0, 2.0]
    assert v_all[0, 0, :, 0].tolist() == [-1.0, -1.0, -2.0, -2.0]
    assert torch.all(c.k[1] == 0)  # other layers untouched


def test_rollback_then_write_overwrites():
    c = make_cache()
    c.write(0, *kv(4, 1.0))
    c.commit(4)
    c.rollback(3)
    assert c.length == 1
    k_all, _ = c.write(0, *kv(1, 5.0))
    assert k_all[0, 0, :, 0].tolist() == [1.0, 5.0]


def test_commit_bounds():
    c = make_cache(8)
    c.commit(0)
    assert c.length == 0
    with pytest.raises(ValueError):
        c.commit(-1)
    c.commit(8)
    assert c.length == 8
    with pytest.raises(ValueError):
        c.commit(1)
    assert c.length == 8


def test_rollback_bounds_and_reset():
    c = make_cache(8)
    c.commit(5)
    with pytest.raises(ValueError):
        c.rollback(6)
    with pytest.raises(ValueError):
        c.rollback(-1)
    assert c.length == 5
    c.rollback(0)
    c.rollback(5)
    assert c.length == 0
    c.commit(3)
    c.reset()
    assert c.length == 0


def test_cache_full():
    c = make_cache(4)
    c.write(0, *kv(4, 1.0))  # exactly full is fine
    c.commit(3)
    with pytest.raises(CacheFullError):
        c.write(0, *kv(2, 1.0))
    assert c.length == 3
    assert issubclass(CacheFullError, RuntimeError)


def test_model_forward_past_the_cache_raises(wide_target):
    cache = wide_target.new_cache(5)
    forward(wide_target, [1, 2, 3], cache)
    cache.commit(3)
    with pytest.raises(CacheFullError):
        forward(wide_target, [4, 5, 6], cache)


def test_new_cache_shape(wide_target):
    cfg = wide_target.cfg
    c = wide_target.new_cache(17)
    assert c.k.shape == (cfg.num_hidden_layers, 1, cfg.num_key_value_heads, 17, cfg.head_dim)
    assert c.max_len == 17 and c.length == 0


# ---- target cache, rounds driven by hand as the engine drives them ------------------------------------------------
def run_target_rounds(model, prompt: list[int], rounds: list[tuple[int, int]], seed: int) -> None:
    """rounds: (gamma, num_accepted). Drafts are random; on rejection at j the recovered token differs from d_j."""
    rng = random.Random(seed)
    V = model.vocab_size
    cache = model.new_cache(len(prompt) + sum(g + 1 for g, _ in rounds) + 2)
    if len(prompt) > 1:  # as the engine: prefill all but the last prompt token, which becomes `pending`
        forward(model, prompt[:-1], cache, last_n=1)
        cache.commit(len(prompt) - 1)
    text, pending = list(prompt[:-1]), prompt[-1]
    for gamma, n in rounds:
        draft = [rng.randrange(V) for _ in range(gamma)]
        logits = forward(model, [pending] + draft, cache)
        # Every row of the verification forward equals a fresh prefill of the text up to it.
        assert_close(logits, fresh_logits(model, text + [pending] + draft)[-(gamma + 1):])
        extra = rng.randrange(V)
        if n < gamma:
            extra = (draft[n] + 1 + rng.randrange(V - 1)) % V  # a recovered token is never the rejected draft
        cache.commit(n + 1)
        text += [pending] + draft[:n]
        pending = extra
        assert cache.length == len(text)
        # The next forward (pending alone) sees exactly the accepted text.
        assert_close(forward(model, [pending], cache)[-1], fresh_logits(model, text + [pending])[-1])


@pytest.mark.parametrize(
    "rounds",
    [
        [(4, 0)],  # rejection at position 0
        [(4, 2)],  # rejection in the middle
        [(4, 3)],  # rejection at the last draft
        [(4, 4)],  # all accepted (+ bonus)
        [(3, 0), (3, 3), (5, 2), (1, 0), (1, 1), (6, 6), (2, 1), (4, 0), (7, 5)],  # consecutive rounds
    ],
    ids=["reject-0", "reject-mid", "reject-last", "all-accepted", "many-rounds"],
)
def test_target_cache_after_rounds(target, rounds):
    run_target_rounds(target, [3, 1, 4, 1, 5], rounds, seed=len(rounds))
    run_target_rounds(target, [7], rounds, seed=99)  # one-token prompt: no prefill at all


# ---- draft cache: DraftModelProposer driven by hand -----------------------------------------------------------------
def run_draft_rounds(model, prompt: list[int], rounds: list[tuple[int, int]], seed: int) -> None:
    rng = random.Random(seed)
    V = model.vocab_size
    proposer = DraftModelProposer(model, max_len=len(prompt) + sum(g + 1 for g, _ in rounds) + 8)
    proposer.reset([0], [prompt])
    text = list(prompt)
    gen = torch.Generator().manual_seed(seed)
    for gamma, n in rounds:
        proposal = proposer.propose([0], [gamma], [GREEDY], [gen])[0]
        draft = proposal.tokens.tolist()
        assert len(draft) == gamma
        # Greedy drafts are the draft model's greedy continuation of the whole text (a fresh-prefill check).
        ctx = list(text)
        for d in draft:
            assert d == int(fresh_logits(model, ctx)[-1].argmax()), "draft from a stale cache"
            ctx.append(d)
        if n < gamma:
            extra = (draft[n] + 1 + rng.randrange(V - 1)) % V
        else:
            extra = rng.randrange(V)
        emitted = draft[:n] + [extra]
        proposer.observe(0, Outcome(n, emitted))
        text += emitted
        # The cache holds the text minus `pending`: one token, or two after an all-accepted round.
        pending = proposer.pending[0]
        assert len(pending) == (2 if n == gamma else 1)
        assert pending == text[-len(pending):]
        assert proposer.cache.length(0) == len(text) - len(pending)
        logits = forward(model, pending, proposer.cache.cache.row(0), last_n=1)[-1]  # scratch: nothing committed
        assert_close(logits, fresh_logits(model, text)[-1])


@pytest.mark.parametrize(
    "rounds",
    [
        [(4, 0), (4, 0)],
        [(4, 2), (3, 1)],
        [(4, 3)],
        [(4, 4), (4, 4)],  # all accepted twice: the draft catches up with two pending tokens each time
        [(1, 1), (1, 0), (1, 1), (1, 1)],
        [(3, 0), (3, 3), (5, 2), (1, 0), (1, 1), (6, 6), (2, 1), (4, 0), (7, 5), (2, 2)],
    ],
    ids=["reject-0", "reject-mid", "reject-last", "all-accepted", "gamma-1", "many-rounds"],
)
def test_draft_cache_after_rounds(draft, rounds):
    run_draft_rounds(draft, [3, 1, 4, 1, 5], rounds, seed=len(rounds))
    run_draft_rounds(draft, [7], rounds, seed=5)


# ---- the real engine, with spies ----------------------------------------------------------------------------------
class CacheSpy:
    """Wraps a model (CausalLM). Tracks which token sits in each cache slot and checks every forward's logits against
    a fresh prefill of [committed slots] + new tokens."""

    def __init__(self, model) -> None:
        self.model = model
        self.vocab_size, self.device, self.dtype = model.vocab_size, model.device, model.dtype
        self.caches: list[tuple[KVCache, list]] = []
        self.log: list[tuple[int, list[int]]] = []  # (committed length, context + new tokens) per forward

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        cache = self.model.new_cache(max_len, batch)
        self.caches.append((cache, [None] * cache.max_len))
        return cache

    def forward(self, tokens: torch.Tensor, cache: KVCache, *, last_n: int | None = None) -> torch.Tensor:
        slots = next(s for c, s in self.caches if c is cache)
        out = self.model.forward(tokens, cache, last_n=last_n)
        new = tokens[0].tolist()
        slots[cache.length : cache.length + len(new)] = new
        text = slots[: cache.length + len(new)]
        assert None not in text
        ref = fresh_logits(self.model, text)[-out.shape[1]:]
        assert_close(out[0], ref)
        self.log.append((cache.length, text))
        return out


class WrongAtProposer(SequenceProposer):
    """Deterministic proposer that knows the greedy continuation and gets position j wrong on purpose."""

    def __init__(self, continuation: list[int], wrong_at: int, vocab: int, prompt_len: int) -> None:
        super().__init__()
        self.continuation, self.wrong_at, self.vocab, self.prompt_len = continuation, wrong_at, vocab, prompt_len
        self.done = 0

    def reset(self, prompt: list[int]) -> None:
        self.done = len(prompt) - self.prompt_len  # it starts after the first round's token

    def propose(self, gamma, sampling, generator) -> Proposal:
        toks = list(self.continuation[self.done : self.done + gamma])
        toks += [0] * (gamma - len(toks))
        if self.wrong_at < gamma:
            toks[self.wrong_at] = (toks[self.wrong_at] + 1) % self.vocab
        return Proposal(tokens=torch.tensor(toks, dtype=torch.long))

    def observe(self, num_accepted: int, emitted: list[int], extra_logits=None) -> None:
        self.done += len(emitted)


def check_log_against_output(log, prompt, out) -> None:
    """Each target forward starts at its committed prefix + pending token, all of which is real text, and
    the committed prefix grows every round."""
    full = prompt + out
    lengths = [n for n, _ in log]
    for n, text in log:
        assert text[: n + 1] == full[: n + 1]
    assert lengths == sorted(lengths) and len(set(lengths[1:])) == len(lengths[1:])


@pytest.mark.parametrize("wrong_at", [0, 1, 3, 99], ids=["reject-0", "reject-1", "reject-3", "never"])
def test_engine_target_cache_with_forced_rejections(target, wrong_at):
    prompt = [5, 9, 2, 11]
    params = GenerationParams(max_new_tokens=20, gamma=4, sampling=GREEDY)
    plain = generate(target, prompt, params).token_ids
    spy = CacheSpy(target)
    res = generate(spy, prompt, params, WrongAtProposer(plain, wrong_at, target.vocab_size, prompt_len=len(prompt)))
    assert res.token_ids == plain
    check_log_against_output(spy.log[1:], prompt, res.token_ids)  # log[0] is the prefill
    m = res.metrics
    if wrong_at == 99:
        assert m.accepted == m.drafted
    else:
        # Every round that drafted past wrong_at accepted exactly wrong_at drafts.
        assert m.accepted_per_position[wrong_at] == 0 and m.drafted_per_position[wrong_at] > 0
        assert all(a == d for a, d in zip(m.accepted_per_position[:wrong_at], m.drafted_per_position[:wrong_at]))


def test_engine_both_caches_sampling_many_rounds(tiny_target, tiny_draft):
    """Temperature 1 with a noisy draft: rejections at 0, in the middle and full acceptance all happen; both caches
    match a fresh prefill at every forward of the target and of the draft."""
    outcomes: list[tuple[int, int]] = []

    def recording_verifier(draft, p, q, generator):
        v = verify_chain(draft, p, q, generator)
        outcomes.append((draft.shape[1], int(v.num_accepted[0])))
        return v

    target_spy, draft_spy = CacheSpy(tiny_target), CacheSpy(tiny_draft)
    for seed in range(6):
        prompt = [seed % 6, 2, 4]
        params = GenerationParams(max_new_tokens=30, gamma=4, sampling=SamplingParams(temperature=1.0), seed=seed)
        target_spy.log.clear()
        res = generate(target_spy, prompt, params, DraftModelProposer(draft_spy, 64), verifier=recording_verifier)
        assert len(res.token_ids) == 30
        check_log_against_output(target_spy.log[1:], prompt, res.token_ids)
    full = [(g, n) for g, n in outcomes if g == 4]
    assert any(n == 0 for _, n in full) and any(0 < n < 4 for _, n in full) and any(n == 4 for _, n in full)
    assert len(draft_spy.log) > 100


def test_draft_with_a_shorter_context_stops_drafting_instead_of_overflowing(wide_target):
    """A draft model whose max_position_embeddings is below the request: new_cache() caps its cache, so the
    proposer must clamp gamma by the cache it actually has (and then stop proposing), not by the max_len it was
    asked for. The output is plain greedy either way."""
    short_cfg = dataclasses.replace(wide_target.cfg, max_position_embeddings=24)
    short_draft = LlamaModel(short_cfg)
    short_draft.load_state_dict(wide_target.state_dict())
    short_draft.eval()
    prompt = [1, 2, 3, 4, 5]
    params = GenerationParams(max_new_tokens=40, gamma=4, sampling=GREEDY)
    plain = generate(wide_target, prompt, params).token_ids
    res = generate(wide_target, prompt, params, DraftModelProposer(short_draft, 60))
    assert res.token_ids == plain
    assert res.metrics.accepted == res.metrics.drafted > 0  # same weights: it drafted (correctly) while it could
