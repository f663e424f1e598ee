"""The one batched round (verispec.engine.Batch.round), with several rows at once.

`generate` is one row of it, so the rest of the suite covers B = 1. Here rows of different prompts, lengths,
strategies, sampling settings and gammas share rounds, as in the server:
  * greedy: every row's output equals what `generate` gives that request alone, for every strategy, at 1, 4
    and 8 rows;
  * sampling: with 4 mixed rows, each row's law of its first W tokens matches the enumerated target law (TV
    against the measured noise floor, and chi-square: tests/test_losslessness.py's check), and the broken
    verifiers fail that same check through the same batched path;
  * isolation: a row whose verification or proposer fails ends (or falls back) alone; rows beside it, and rows
    with extreme but valid sampling parameters, keep the output they would have had alone.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.test_losslessness import (
    PROMPT, T1, T07_P09, Verdict, W, bonus_replaces_last_draft, chi_square_pvalue, exact_law, noise_floor,
    residual_is_p, tv,
)
from tests.test_ngram import LOOKUP_PROMPT
from verispec import strategies
from verispec.batch import prefill_rows
from verispec.engine import Batch, GenerationParams, NewSequence, generate
from verispec.models.load import LoadedModel
from verispec.sampling import SamplingParams, mix_seed
from verispec.verify import verify_chain

GREEDY = SamplingParams(temperature=0.0)
T07 = SamplingParams(temperature=0.7)
# cross re-tokenizes text: these token-id models have no tokenizer; test_cross.py runs it in batches of rows
ALL = [name for name in strategies.STRATEGIES if name != "cross"]
OPTIONS = strategies.StrategyOptions(layerskip_layers=1, lookahead_window=3)


@pytest.fixture(scope="module", autouse=True)
def _eagle_drafter(wide_target, tmp_path_factory):
    """OPTIONS name an EAGLE drafter and Medusa heads for wide_target (untrained: these tests are about the round,
    not acceptance)."""
    global OPTIONS
    from verispec.models.eagle import EagleConfig, EagleDrafter
    from verispec.models.medusa import MedusaConfig, MedusaHeads

    path = tmp_path_factory.mktemp("eagle")
    EagleDrafter.fresh(EagleConfig.for_target(wide_target, "wide"), wide_target, wide_target.lm_head.weight).save(path)
    heads = tmp_path_factory.mktemp("medusa")
    MedusaHeads.fresh(MedusaConfig.for_target(wide_target, "wide"), wide_target, wide_target.lm_head.weight).save(heads)
    before, OPTIONS = OPTIONS, dataclasses.replace(OPTIONS, drafter=(str(path), str(heads)))
    yield
    OPTIONS = before


def loaded(model, name: str) -> LoadedModel:
    return LoadedModel(model=model, tokenizer=None, path=Path(f"/{name}"), name=name)


def proposer(name: str, target, draft, rows: int, max_len: int = 128):
    return strategies.make_proposer(name, loaded(target, "t"), loaded(draft, "d"), max_len, OPTIONS, rows=rows)


def prompts(vocab: int, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in range(n)]


# ---- greedy: every row equals generate ---------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [1, 4, 8])
def test_rows_of_every_strategy_equal_generate_alone(wide_target, wide_draft, rows):
    """`rows` sequences of different lengths, strategies and gammas at once; more requests than rows wait and
    join as rows free up (the server's admission), so every strategy meets every other in some round."""
    n = 2 * len(ALL)
    texts = prompts(wide_target.vocab_size, n, seed=rows)
    names = [ALL[i % len(ALL)] for i in range(n)]
    params = [GenerationParams(max_new_tokens=8 + 5 * (i % 5), gamma=1 + i % 5, sampling=GREEDY) for i in range(n)]
    expected = [generate(wide_target, t, p, proposer(s, wide_target, wide_draft, 1)).token_ids
                for t, p, s in zip(texts, params, names)]
    batch = Batch(wide_target, rows, 128, slack=32)
    shared = {s: proposer(s, wide_target, wide_draft, rows) for s in ALL}  # one proposer serves all its rows
    waiting, seqs, widest = list(range(n)), {}, 0
    while waiting or batch.live:
        while waiting and len(batch.live) < rows:
            i = waiting.pop(0)
            seqs[i] = batch.add(texts[i], params[i], shared[names[i]])
        widest = max(widest, len({id(s.proposer) for s in batch.live}))
        batch.round()
    for i in range(n):
        assert seqs[i].result.finish_reason == "length" and seqs[i].result.error is None
        assert seqs[i].out == expected[i], (names[i], texts[i])
    assert rows == 1 or widest >= 3  # rounds really mixed strategies


def test_rows_prefilled_together_equal_generate_alone(wide_target, wide_draft):
    """add_many: rows of different prompt lengths and strategies prefilled in one target forward, their
    proposers then started in one reset each (the draft model's rows prefilled in one draft forward), give what
    each request gives alone; a request that cannot run is refused before anything is prefilled."""
    names = ["draft", "draft", "adaptive", "draft+ngram", "tree", "layerskip", "eagle", "medusa", "ar", "draft"]
    texts = prompts(wide_target.vocab_size, len(names), seed=11)
    params = [GenerationParams(max_new_tokens=12, gamma=2 + i % 3, sampling=GREEDY) for i in range(len(names))]
    expected = [generate(wide_target, t, p, proposer(s, wide_target, wide_draft, 1)).token_ids
                for t, p, s in zip(texts, params, names)]
    batch = Batch(wide_target, len(names), 128, slack=32)
    shared = {s: proposer(s, wide_target, wide_draft, len(names)) for s in set(names) if s != "ar"}
    with pytest.raises(ValueError, match="exceeds the model's context"):
        batch.add_many([NewSequence(texts[0], params[0]), NewSequence(texts[1], GenerationParams(max_new_tokens=500))])
    assert not batch.live and all(batch.target.length(r) == 0 for r in range(len(names)))
    seqs = batch.add_many([NewSequence(t, p, shared.get(s)) for t, p, s in zip(texts, params, names)])
    while batch.live:
        batch.round()
    for seq, want, name in zip(seqs, expected, names):
        assert seq.result.finish_reason == "length" and seq.out == want, name
    assert all(seq.metrics.drafted for seq, name in zip(seqs, names) if name != "ar")


def test_rows_with_one_prompt_share_its_prefill(wide_target, wide_draft):
    """A request's n choices: rows with the same prompt are computed once in the joint prefill and copied (the
    target's and the draft's caches, and the features EAGLE starts from), and each row gives what it would alone."""
    a, b = prompts(wide_target.vocab_size, 2, seed=5)
    a, b = a + [3, 1, 4], b + [1, 5]  # at least 3 tokens: something to prefill
    texts = [a, a, b, a, a, a]
    names = ["draft", "draft", "draft", "eagle", "eagle", "ar"]
    params = GenerationParams(max_new_tokens=12, gamma=3, sampling=GREEDY)
    expected = [generate(wide_target, t, params, proposer(s, wide_target, wide_draft, 1)).token_ids
                for t, s in zip(texts, names)]
    batch = Batch(wide_target, len(texts), 128, slack=32)
    shared = {s: proposer(s, wide_target, wide_draft, len(texts)) for s in set(names) if s != "ar"}
    widths = []
    forward = batch.target.forward

    def spy(rows, chains, **kw):
        widths.append(len(rows))
        return forward(rows, chains, **kw)

    batch.target.forward = spy
    seqs = batch.add_many([NewSequence(t, params, shared.get(s)) for t, s in zip(texts, names)])
    assert widths == [2]  # two distinct prompts in the forward
    k, v = batch.target.cache.k, batch.target.cache.v
    for r in (1, 3, 4, 5):
        assert batch.target.length(r) == len(a) - 1
        assert torch.equal(k[:, r, :, : len(a) - 1], k[:, 0, :, : len(a) - 1])
        assert torch.equal(v[:, r, :, : len(a) - 1], v[:, 0, :, : len(a) - 1])
    while batch.live:
        batch.round()
    for seq, want, name in zip(seqs, expected, names):
        assert seq.result.finish_reason == "length" and seq.out == want, name


def test_loop_rows_copy_a_row_as_its_own_prefill_would_write_it():
    """The transformers adapter's rows (one cache each): a row copied from another continues as if it had been
    prefilled itself, and the source row is unchanged."""
    from tests.tiny_hf import make_tiny_hf_dir
    from verispec.batch import LoopRows
    from verispec.models.hf import HFCausalLM

    with tempfile.TemporaryDirectory() as d:
        model = HFCausalLM.from_dir(make_tiny_hf_dir(Path(d) / "t", seed=0), dtype=torch.float32)
    rows = LoopRows(model, 3, 32, slack=8)
    got = prefill_rows(rows, [0, 1, 2], [[7, 8, 9], [7, 8, 9], [4, 5]])
    assert got == [None, None, None] and [rows.length(r) for r in range(3)] == [3, 3, 2]
    alone = LoopRows(model, 1, 32, slack=8)
    prefill_rows(alone, [0], [[7, 8, 9]])
    want = alone.forward([0], [[10, 11]])[0]
    torch.testing.assert_close(rows.forward([1], [[10, 11]])[0], want, rtol=0, atol=0)  # the copy
    rows.commit(1, 2)  # the copy moves on; the row it was copied from must not
    torch.testing.assert_close(rows.forward([0], [[10, 11]])[0], want, rtol=0, atol=0)


def test_a_prompt_that_begins_like_a_stored_one_prefills_only_the_rest(wide_target):
    """prefill_rows with a prefix cache: the stored prompt's keys/values are restored and only the remainder runs
    through the model; the row's cache and last-block outputs are what its own prefill writes."""
    from verispec.batch import make_rows
    from verispec.prefix import PrefixCache

    p, q = prompts(wide_target.vocab_size, 2, seed=3)
    p, q = p + [5, 6, 7, 8, 9], q + [2, 3]
    rows, fresh = make_rows(wide_target, 2, 64, 8), make_rows(wide_target, 1, 64, 8)
    prefix = PrefixCache(2**30, min_tokens=4)
    prefill_rows(rows, [0], [p], prefix)
    chains = []
    forward = rows.forward

    def spy(rr, cc, **kw):
        chains.append([list(c) for c in cc])
        return forward(rr, cc, **kw)

    rows.forward = spy
    got = prefill_rows(rows, [1], [p + q], prefix)[0]
    assert chains == [[(p + q)[len(p):]]] and prefix.hits == 1  # the stored p, then q alone
    want = prefill_rows(fresh, [0], [p + q])[0]
    n = len(p + q)
    assert rows.length(1) == n  # float32 matmuls of other shapes round differently: close, not equal, here
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rows.cache.k[:, 1, :, :n], fresh.cache.k[:, 0, :, :n], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rows.cache.v[:, 1, :, :n], fresh.cache.v[:, 0, :, :n], rtol=1e-4, atol=1e-4)
    chains.clear()
    again = prefill_rows(rows, [0], [p + q], prefix)[0]  # the whole prompt stored: its last token runs alone
    assert chains == [[[(p + q)[-1]]]]
    torch.testing.assert_close(again, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["draft", "eagle", "ar"])
def test_rows_that_reuse_a_stored_prompt_equal_generate_alone(wide_target, wide_draft, name):
    """A conversation's next turn through a batch with a prefix cache: its prompt begins with the last one's, which
    is restored, not prefilled; the output is what the request gives alone."""
    from verispec.prefix import PrefixCache

    first, more = prompts(wide_target.vocab_size, 2, seed=9)
    first = first + [4, 4, 2, 1, 7]
    texts = [first, first + more + [3], first]  # the next turn, then the first prompt again
    params = GenerationParams(max_new_tokens=10, gamma=3, sampling=GREEDY)
    expected = [generate(wide_target, t, params, proposer(name, wide_target, wide_draft, 1)).token_ids for t in texts]
    prefix = PrefixCache(2**30, min_tokens=4)
    batch = Batch(wide_target, 2, 128, slack=32, prefix=prefix)
    shared = proposer(name, wide_target, wide_draft, 2) if name != "ar" else None
    for text, want in zip(texts, expected):
        seq = batch.add(text, params, shared)
        while batch.live:
            batch.round()
        assert seq.result.finish_reason == "length" and seq.out == want
    assert prefix.hits == 2


@pytest.mark.parametrize("name", ["draft", "eagle", "ar"])
def test_the_next_turn_reuses_the_last_answer(wide_target, wide_draft, name):
    """A sequence that ends stores its prompt and answer: a prompt that goes on from the answer restores all of it
    (features included, as a fresh prefill gives them) and decodes as it would alone."""
    from verispec.batch import make_rows
    from verispec.prefix import PrefixCache

    first, more = prompts(wide_target.vocab_size, 2, seed=21)
    first = first + [4, 4, 2, 1, 7]
    params = GenerationParams(max_new_tokens=10, gamma=3, sampling=GREEDY)
    prefix = PrefixCache(2**30, min_tokens=4)
    batch = Batch(wide_target, 2, 128, slack=32, prefix=prefix)
    shared = proposer(name, wide_target, wide_draft, 2) if name != "ar" else None
    seq = batch.add(first, params, shared)
    while batch.live:
        batch.round()
    answer = seq.out
    (entry,) = prefix.entries
    assert list(entry.tokens) == first + answer[:-1]  # the last token was never fed back: not in the cache
    fresh = make_rows(wide_target, 1, 128, 8)
    want = prefill_rows(fresh, [0], [list(entry.tokens)])[0]
    torch.testing.assert_close(entry.hidden, want, rtol=1e-4, atol=1e-4)
    then = first + answer + more + [3]
    expected = generate(wide_target, then, params, proposer(name, wide_target, wide_draft, 1)).token_ids
    seq = batch.add(then, params, shared)
    while batch.live:
        batch.round()
    assert seq.out == expected
    assert prefix.hits == 1 and prefix.reused_tokens == len(first) + len(answer) - 1


def test_prefix_cache_keeps_the_most_recent_prompts_within_its_budget():
    from verispec.prefix import PrefixCache

    cache = PrefixCache(300, min_tokens=2)
    cache.put([1], "short", None, 10)  # under min_tokens: not kept
    cache.put([1, 2, 3], "a", None, 100)
    cache.put([1, 2, 3, 4], "a longer", None, 100)  # extends [1, 2, 3]: replaces it
    cache.put([5, 6, 7], "b", None, 100)
    assert [e.snapshot for e in cache.entries] == ["a longer", "b"]
    assert cache.match([1, 2, 9])[1] == 2 and cache.match([5, 6, 7, 8])[1] == 3 and cache.match([9, 1]) is None
    cache.put([8, 9], "c", None, 150)  # over the budget: the least recently used ("a longer") goes
    assert [e.snapshot for e in cache.entries] == ["b", "c"] and cache.nbytes == 250
    cache.put([1, 1], "too big", None, 301)
    assert [e.snapshot for e in cache.entries] == ["b", "c"]
    with pytest.raises(ValueError):
        PrefixCache(-1)


# ---- sampling: the law of each row of a mixed batch ----------------------------------------------------------------
@dataclass(frozen=True)
class RowCase:
    strategy: str
    sampling: SamplingParams
    gamma: int
    prompt: tuple[int, ...]


MIXED = [  # two rows share the draft model's batched forward; n-gram copies; layer skip drafts in the target cache
    RowCase("draft", T1, 3, tuple(PROMPT)),
    RowCase("draft", T07_P09, 2, tuple(PROMPT)),
    RowCase("ngram", T07, 2, tuple(LOOKUP_PROMPT)),
    RowCase("layerskip", T1, 2, tuple(PROMPT)),
]
N = 1000  # sequences per row: the losslessness suite's N


COPIES = 25  # copies of the 4 MIXED rows in one batch (100 rows, interleaved): ~3x faster than 4 rows a batch


def sample_mixed(target, draft, seed_base: int, verifier=verify_chain, n: int = N) -> tuple[list[np.ndarray], list[float]]:
    """Counts of each MIXED row's first W tokens over n sequences of each (batches of COPIES x the 4 rows, seeds
    seed_base + 10 i + r for the i-th copy of row r), and each row's alpha."""
    V = target.vocab_size
    counts = [np.zeros((V,) * W, dtype=np.int64) for _ in MIXED]
    accepted, drafted = [0] * len(MIXED), [0] * len(MIXED)
    rows = len(MIXED) * COPIES
    batch = Batch(target, rows, 32, slack=16, verifier=verifier)
    shared = {c.strategy: proposer(c.strategy, target, draft, rows, 32) for c in MIXED}
    for i0 in range(0, n, COPIES):
        seqs = [(r, batch.add(list(c.prompt), GenerationParams(max_new_tokens=max(W, c.gamma + 1), gamma=c.gamma,
                                                               sampling=c.sampling, seed=seed_base + 10 * i + r),
                              shared[c.strategy]))
                for i in range(i0, min(n, i0 + COPIES)) for r, c in enumerate(MIXED)]
        while batch.live:
            batch.round()
        for r, seq in seqs:
            counts[r][tuple(seq.out[:W])] += 1
            accepted[r] += seq.metrics.accepted
            drafted[r] += seq.metrics.drafted
    return counts, [a / d if d else float("nan") for a, d in zip(accepted, drafted)]


def verdicts(target, counts: list[np.ndarray], alphas: list[float], n: int = N) -> list[Verdict]:
    out = []
    for c, k, a in zip(MIXED, counts, alphas):
        law = exact_law(target, c.sampling, list(c.prompt))
        out.append(Verdict(tv(k, law), noise_floor(law, n, seed=12345), chi_square_pvalue(k, law), a))
    return out


def test_mixed_rows_keep_each_rows_law(tiny_target, tiny_draft):
    counts, alphas = sample_mixed(tiny_target, tiny_draft, 61_000_000)
    for c, v in zip(MIXED, verdicts(tiny_target, counts, alphas)):
        print(f"\n[batched {c.strategy} T={c.sampling.temperature} top_p={c.sampling.top_p} gamma={c.gamma}] {v}")
        assert 0.05 < v.alpha < 0.95, (c, v)  # drafts were made, and some were rejected
        assert v.passes, (c, v)


# 14 s and 16 s: under -m slow; the default run catches both through one row (test_losslessness) and keeps the
# batched round's law test
@pytest.mark.slow
@pytest.mark.parametrize("broken", [residual_is_p, bonus_replaces_last_draft])
def test_broken_verifiers_fail_through_the_batched_round(tiny_target, tiny_draft, broken):
    """The check has power on the path the server runs: a broken chain rule passed to the round is rejected on
    every row, whatever its strategy. 3N batches: at N the layer-skip row's rejection was a coin toss under
    residual_is_p (TV 0.135 against a threshold of 0.147, chi-square p 0.009, after the seeds were mixed)."""
    counts, alphas = sample_mixed(tiny_target, tiny_draft, 62_000_000, verifier=broken, n=3 * N)
    results = verdicts(tiny_target, counts, alphas, n=3 * N)
    for c, v in zip(MIXED, results):
        print(f"\n[{broken.__name__} batched {c.strategy} T={c.sampling.temperature} gamma={c.gamma}] {v}")
    assert not any(v.passes for v in results), results


# ---- isolation --------------------------------------------------------------------------------------------------
def run_rows(target, draft, cases: list[tuple[str, GenerationParams]], texts, verifier=verify_chain,
             fall_back: bool = False):
    batch = Batch(target, len(cases), 128, slack=32, verifier=verifier, fall_back=fall_back)
    shared = {s: proposer(s, target, draft, len(cases)) for s, _ in cases}
    seqs = [batch.add(t, p, shared[s]) for t, (s, p) in zip(texts, cases)]
    while batch.live:
        batch.round()
    return seqs


def test_a_row_whose_verification_fails_ends_alone(wide_target, wide_draft):
    texts = prompts(wide_target.vocab_size, 4, seed=5)
    cases = [("draft", GenerationParams(max_new_tokens=20, gamma=3, sampling=T1, seed=100 + r)) for r in range(4)]

    def fails_for_row_2(draft, p, q, generator):
        if generator.initial_seed() == mix_seed(102):
            raise FloatingPointError("injected: row 2's verification")
        return verify_chain(draft, p, q, generator)

    alone = [generate(wide_target, t, p, proposer(s, wide_target, wide_draft, 1)).token_ids
             for t, (s, p) in zip(texts, cases)]
    seqs = run_rows(wide_target, wide_draft, cases, texts, verifier=fails_for_row_2)
    assert seqs[2].result.finish_reason == "error" and isinstance(seqs[2].result.error, FloatingPointError)
    for r in (0, 1, 3):
        assert seqs[r].result.finish_reason == "length" and seqs[r].out == alone[r], r


@pytest.mark.parametrize("fall_back", [True, False], ids=["server-falls-back", "library-fails"])
def test_a_failing_proposer_costs_its_row_alone(wide_target, wide_draft, fall_back):
    texts = prompts(wide_target.vocab_size, 3, seed=6)
    cases = [("ngram", GenerationParams(max_new_tokens=16, gamma=2, sampling=GREEDY)),
             ("draft", GenerationParams(max_new_tokens=16, gamma=3, sampling=GREEDY)),
             ("lookahead", GenerationParams(max_new_tokens=16, gamma=2, sampling=GREEDY))]
    plain = [generate(wide_target, t, GenerationParams(max_new_tokens=16, sampling=GREEDY)).token_ids for t in texts]
    batch = Batch(wide_target, 3, 128, slack=32, fall_back=fall_back)
    shared = {s: proposer(s, wide_target, wide_draft, 3) for s, _ in cases}
    real = shared["draft"].propose

    def broken(rows, *args):
        if 1 in rows:
            raise RuntimeError("injected: the draft model failed")
        return real(rows, *args)

    shared["draft"].propose = broken
    seqs = [batch.add(t, p, shared[s]) for t, (s, p) in zip(texts, cases)]
    while batch.live:
        batch.round()
    assert seqs[0].out == plain[0] and seqs[2].out == plain[2]
    if fall_back:
        assert seqs[1].fell_back and seqs[1].out == plain[1] and seqs[1].result.finish_reason == "length"
    else:
        assert seqs[1].result.finish_reason == "error" and "injected" in str(seqs[1].result.error)


@pytest.mark.parametrize("fall_back", [True, False], ids=["server-falls-back", "library-fails"])
def test_a_failing_draft_prefill_costs_its_row_alone(wide_target, wide_draft, fall_back):
    """Rows that start together share one reset (one draft prefill); where it fails for one of them, that row
    alone goes on target-only (or ends), and the others start drafting as they would have alone."""
    texts = prompts(wide_target.vocab_size, 3, seed=9)
    params = GenerationParams(max_new_tokens=16, gamma=3, sampling=GREEDY)
    plain = [generate(wide_target, t, GenerationParams(max_new_tokens=16, sampling=GREEDY)).token_ids for t in texts]
    shared = proposer("draft", wide_target, wide_draft, 3)
    real = shared.reset
    poison = texts[1]

    def broken(rows, prompts, *args):
        if any(p[: len(poison)] == poison for p in prompts):
            raise RuntimeError("injected: the draft's prefill failed")
        return real(rows, prompts, *args)

    shared.reset = broken
    batch = Batch(wide_target, 3, 128, slack=32, fall_back=fall_back)
    seqs = batch.add_many([NewSequence(t, params, shared) for t in texts])
    while batch.live:
        batch.round()
    for r in (0, 2):
        assert seqs[r].out == plain[r] and seqs[r].metrics.drafted > 0 and not seqs[r].fell_back, r
    if fall_back:
        assert seqs[1].fell_back and seqs[1].out == plain[1] and seqs[1].metrics.drafted == 0
    else:
        assert seqs[1].result.finish_reason == "error" and "injected" in str(seqs[1].result.error)


def test_a_repeated_drafting_failure_logs_one_traceback(wide_target, wide_draft, caplog):
    """A failure that repeats on every row is logged in full once and in one line after: a flood of tracebacks
    once filled a server's stderr pipe and stalled it (benchmarks/results/2026-11-25-xeon-amx-structured-output)."""
    texts = prompts(wide_target.vocab_size, 3, seed=8)
    params = GenerationParams(max_new_tokens=6, gamma=2, sampling=GREEDY)
    shared = proposer("draft", wide_target, wide_draft, 3)

    def broken(rows, *args):
        raise RuntimeError("injected: the draft model failed")

    shared.propose = broken
    batch = Batch(wide_target, 3, 128, slack=32, fall_back=True)
    seqs = [batch.add(t, params, shared) for t in texts]
    with caplog.at_level(logging.WARNING, logger="verispec"):
        while batch.live:
            batch.round()
    failures = [r for r in caplog.records if "drafting failed" in r.getMessage()]
    assert len(failures) == 3 and all("injected" in r.getMessage() for r in failures)
    assert [r.exc_info is not None for r in failures] == [True, False, False]
    assert all(s.fell_back and s.result.finish_reason == "length" for s in seqs)


EXTREMES = [  # valid, finite, and once able to turn the processed distribution into NaN
    SamplingParams(temperature=1e-30), SamplingParams(temperature=5e-324), SamplingParams(temperature=1e-6),
    SamplingParams(temperature=1.0, top_p=1e-12), SamplingParams(temperature=1e-30, top_p=1e-12, top_k=1),
    SamplingParams(temperature=2.0, top_k=1), SamplingParams(temperature=1e30),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=["f32", "bf16", "f64"])
def test_extreme_sampling_parameters_hurt_no_row(wide_target, wide_draft, dtype):
    """Each extreme row runs beside a greedy and a seeded row; all finish, and the neighbours' outputs are what
    they are alone."""
    target, draft = copy.deepcopy(wide_target).to(dtype), copy.deepcopy(wide_draft).to(dtype)
    texts = prompts(target.vocab_size, 3, seed=7)
    neighbours = [("draft", GenerationParams(max_new_tokens=12, gamma=3, sampling=GREEDY)),
                  ("draft+ngram", GenerationParams(max_new_tokens=12, gamma=2, sampling=T07, seed=9))]
    alone = [generate(target, t, p, proposer(s, target, draft, 1)).token_ids
             for t, (s, p) in zip(texts[1:], neighbours)]
    vocab = target.vocab_size
    for extreme in EXTREMES:
        cases = [("draft", GenerationParams(max_new_tokens=12, gamma=3, sampling=extreme, seed=1)), *neighbours]
        seqs = run_rows(target, draft, cases, texts)
        assert all(s.result.finish_reason == "length" for s in seqs), (extreme, [s.result.error for s in seqs])
        assert all(0 <= t < vocab for t in seqs[0].out)
        assert [s.out for s in seqs[1:]] == alone, extreme
