"""End to end on the real Qwen2.5-Coder pair (GBs of weights): run with `pytest -m slow`."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow

PROMPTS = [
    ("def quicksort(arr):", False),
    ("Write a Python function that checks whether a string is a palindrome.", True),
    ("class Stack:\n    def __init__(self):", False),
]


@pytest.fixture(scope="module")
def models():
    from verispec.models.load import check_pair, load
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

    target = load(DEFAULT_TARGET, progress=False)
    draft_int8 = load(DEFAULT_DRAFT, dtype="int8", progress=False)
    check_pair(target, draft_int8)
    return target, draft_int8


def _prompt(tok, text: str, chat: bool) -> list[int]:
    return tok.chat(text) if chat else tok.encode(text)


@pytest.mark.parametrize("text, chat", PROMPTS)
def test_greedy_speculative_equals_plain_on_real_pair(models, text, chat):
    from verispec.engine import GenerationParams, generate
    from verispec.proposers.draft_model import DraftModelProposer

    target, draft = models
    tok = target.tokenizer
    prompt = _prompt(tok, text, chat)
    params = GenerationParams(max_new_tokens=48, gamma=4, eos_ids=tok.eos_ids)
    plain = generate(target.model, prompt, params)
    spec = generate(target.model, prompt, params, DraftModelProposer(draft.model, len(prompt) + 60))
    assert spec.token_ids == plain.token_ids, (tok.decode(plain.token_ids), tok.decode(spec.token_ids))
    assert spec.metrics.alpha > 0.3  # the pair shares a family: a much lower value means a broken draft
    assert spec.metrics.rounds < plain.metrics.rounds


def test_rollback_on_real_target_matches_fresh_prefill(models):
    """After verifying a wrong draft, the committed cache gives the logits of a fresh prefill."""
    target, _ = models
    model = target.model
    ids = target.tokenizer.encode("def add(a, b):\n    return a + b\n")
    cache = model.new_cache(128)
    model.forward(torch.tensor([ids[:-1]]), cache, last_n=1)
    cache.commit(len(ids) - 1)
    wrong = [ids[-1], 11, 22, 33]  # pending token + 3 drafts, of which only the pending one is kept
    model.forward(torch.tensor([wrong]), cache)
    cache.commit(1)
    after = model.forward(torch.tensor([[44]]), cache)[0, -1].float()
    fresh_cache = model.new_cache(128)
    fresh = model.forward(torch.tensor([ids + [44]]), fresh_cache, last_n=1)[0, -1].float()
    # bfloat16: compare the decisions and the scale of the difference, not bits
    assert after.argmax() == fresh.argmax()
    assert (after - fresh).abs().max() < 0.5
    assert set(torch.topk(after, 5).indices.tolist()) == set(torch.topk(fresh, 5).indices.tolist())


@pytest.fixture(scope="module")
def w4a8_pair():
    """The fastest precision: w4a8 target, 4-bit draft (skipped where the kernel cannot be built; the first run
    quantizes both models, about a minute each)."""
    from verispec.models.kernels import KernelError, w4a8
    from verispec.models.load import load
    from verispec.models.packaged import DEFAULT_DRAFT, DEFAULT_TARGET

    try:
        w4a8()
    except KernelError as e:
        pytest.skip(str(e))
    return load(DEFAULT_TARGET, dtype="w4a8", progress=False), load(DEFAULT_DRAFT, dtype="w4a8-4bit", progress=False)


def test_w4a8_greedy_speculative_equals_plain_on_real_pair(w4a8_pair):
    """The fastest precision keeps the greedy identity: draft+ngram and draft rounds."""
    from verispec.engine import GenerationParams, generate
    from verispec.strategies import StrategyOptions, make_proposer

    target, draft = w4a8_pair
    tok = target.tokenizer
    for text, chat in PROMPTS[:2]:
        prompt = _prompt(tok, text, chat)
        params = GenerationParams(max_new_tokens=64, gamma=4, eos_ids=tok.eos_ids)
        plain = generate(target.model, prompt, params)
        for strategy in ("draft+ngram", "draft"):
            proposer = make_proposer(strategy, target, draft, len(prompt) + 80, StrategyOptions())
            spec = generate(target.model, prompt, params, proposer)
            assert spec.token_ids == plain.token_ids, (strategy, tok.decode(plain.token_ids), tok.decode(spec.token_ids))
            assert spec.metrics.rounds < plain.metrics.rounds


def test_w4a8_token_trees_equal_plain_on_real_pair(w4a8_pair):
    """Wide trees on the real pair: siblings' slots sit between a node's keys, which once rounded its softmax apart
    from a decoding step's (a near-tie flipped a token); the planned tree too."""
    from verispec.bench.suite import load_prompts
    from verispec.engine import GenerationParams, generate
    from verispec.proposers.tree import TreeDraftProposer
    from verispec.theory import TreeShape

    target, draft = w4a8_pair
    tok = target.tokenizer
    wide = TreeShape.from_paths([(0,), (1,), (2,), (3,), (0, 0), (0, 1), (0, 2), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])
    suite = load_prompts("suite", categories=["code_completion", "math", "translation"], limit=1)
    for i, item in enumerate(suite):  # (one of these flipped a token before keys were packed)
        prompt = tok.chat(list(item.messages))
        params = GenerationParams(max_new_tokens=128, gamma=len(wide), eos_ids=tok.eos_ids)
        plain = generate(target.model, prompt, GenerationParams(max_new_tokens=128, eos_ids=tok.eos_ids)).token_ids
        for shape in (wide, None) if i == 0 else (wide,):
            proposer = TreeDraftProposer(draft.model, len(prompt) + 150, target.model.vocab_size, shape=shape)
            spec = generate(target.model, prompt, params, proposer)
            assert spec.token_ids == plain, (item.id, shape, tok.decode(plain), tok.decode(spec.token_ids))
            assert spec.metrics.accepted > 10


def test_w4a8_prefix_cache_restores_the_bits_a_fresh_prefill_writes(w4a8_pair):
    """The kernel's rows and the attention's queries do not depend on each other, so a prompt that begins like a
    stored one, restored and prefilled only past it, holds in its cache and outputs the bits of its own prefill,
    and continues as it would."""
    from verispec.batch import make_rows, prefill_rows
    from verispec.engine import Batch, GenerationParams, generate
    from verispec.prefix import PrefixCache

    target, _ = w4a8_pair
    tok, model = target.tokenizer, target.model
    first = tok.chat("Explain what a Python generator is, in two sentences.")
    then = tok.chat([{"role": "user", "content": "Explain what a Python generator is, in two sentences."},
                     {"role": "assistant", "content": "A generator is a function that yields values lazily."},
                     {"role": "user", "content": "Give an example."}])
    common = next((i for i, (a, b) in enumerate(zip(first, then)) if a != b), min(len(first), len(then)))
    assert common > 16
    prefix = PrefixCache(2**30)
    rows, fresh = make_rows(model, 1, 256, 8), make_rows(model, 1, 256, 8)
    prefill_rows(rows, [0], [first], prefix)
    got = prefill_rows(rows, [0], [then], prefix)[0]
    assert prefix.hits == 1 and prefix.reused_tokens == common
    want = prefill_rows(fresh, [0], [then])[0]
    n = len(then)
    assert torch.equal(got, want)
    assert torch.equal(rows.cache.k[:, 0, :, :n], fresh.cache.k[:, 0, :, :n])
    assert torch.equal(rows.cache.v[:, 0, :, :n], fresh.cache.v[:, 0, :, :n])
    params = GenerationParams(max_new_tokens=24, gamma=4, eos_ids=tok.eos_ids)
    batch = Batch(model, 1, 512, prefix=prefix)
    seq = batch.add(then, params)
    while batch.live:
        batch.round()
    assert seq.out == generate(model, then, params).token_ids
