"""Token trees: the pure tree verifier against the exact law, the KV path commit, the draft's tree forwards, the
planner, and the `tree` strategy end to end (greedy identity, the sampled law, broken controls that must fail).

The law test of the pure verifier runs a small "language" whose target and proposer distributions are fixed
functions of the context (vocab 4): rounds of draw-a-tree-then-verify_tree are repeated until W = 3 tokens are out,
so the joint law of those tokens must be the product of the target's conditionals, whatever the tree.
"""

from __future__ import annotations

import functools
import hashlib
import random

import numpy as np
import pytest
import torch

from tests.conftest import fresh_logits
from tests.test_losslessness import (
    T1, T07_P09, W, Verdict, chi_square_pvalue, exact_law, noise_floor, sample_engine, tv,
)
from tests.test_ngram import lossless_verdict, text_after_lookup_rounds
from verispec.batch import NativeRows, tree_layout
from verispec.engine import GenerationParams, generate
from verispec.proposers.mix import DraftNgramProposer
from verispec.proposers.tree import TreeDraftProposer, draw_children
from verispec.sampling import SamplingParams, logits_to_probs
from verispec.theory import (
    TreeShape, best_tree, expected_tokens, expected_tree_tokens, interpolate_cost, plan_tree, tree_cost,
)
from verispec.verify import children_of, verify_tree, verify_tree_greedy

V = 4
N_PURE = 6000  # ~3 s a case
SHAPE = TreeShape.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])  # 3 wide at the root


# ---- a toy language: p and q as fixed functions of the context --------------------------------------------------
@functools.lru_cache(maxsize=None)
def _dist(tag: str, ctx: tuple[int, ...], sampling: SamplingParams) -> torch.Tensor:
    """A fixed distribution per (tag, context): never modified by its callers (they clone)."""
    seed = int.from_bytes(hashlib.sha256(f"{tag}{ctx}".encode()).digest()[:4], "little")
    logits = 2.0 * torch.randn(V, generator=torch.Generator().manual_seed(seed))
    return logits_to_probs(logits, sampling)


def p_of(ctx, sampling):
    return _dist("p", ctx, sampling)


@functools.lru_cache(maxsize=None)
def _dist_list(tag: str, ctx: tuple[int, ...], sampling: SamplingParams) -> tuple[float, ...]:
    return tuple(_dist(tag, ctx, sampling).tolist())  # float32 values, exact as Python floats


def draw_tree(ctx: tuple[int, ...], shape: TreeShape, sampling: SamplingParams, mode: str,
              rng: random.Random) -> tuple[list[int], list[int], torch.Tensor, torch.Tensor]:
    """Children drawn as a drafter would: "iid" (each from the node's q), "worep" (without replacement, each with
    its q renormalised over what is left; fewer children where q runs out) or "det" (the node's top tokens,
    one-hot q). Returns tokens, parents, p rows [N + 1, V] and q rows [N, V]. Drawn in plain Python (4 tokens:
    a torch call a draw made this 3x slower than the verification it feeds)."""
    tokens: list[int] = []
    parents: list[int] = []
    ctxs: list[tuple[int, ...]] = []
    qs: list[tuple[float, ...]] = []
    frontier = [(-1, -1, ctx)]  # (node in the shape, drawn node, its context), breadth first
    while frontier:
        shape_node, drawn, here = frontier.pop(0)
        kids = shape.children(shape_node)
        q = _dist_list("q", here, sampling)
        top = sorted(range(V), key=lambda v: -q[v]) if mode == "det" else []
        for rank, kid in enumerate(kids):
            if mode == "det":
                x = top[rank]
                qk = tuple(float(v == x) for v in range(V))
            else:
                if sum(q) <= 0:
                    break
                x = rng.choices(range(V), weights=q)[0]
                qk = q
                if mode == "worep":
                    rest = [0.0 if v == x else w for v, w in enumerate(q)]
                    total = sum(rest)
                    q = tuple(w / total for w in rest) if total > 0 else tuple(rest)
            tokens.append(x)
            parents.append(drawn)
            qs.append(qk)
            ctxs.append(here + (x,))
            frontier.append((kid, len(tokens) - 1, here + (x,)))
    p = torch.tensor([_dist_list("p", c, sampling) for c in (ctx, *ctxs)])
    return tokens, parents, p, torch.tensor(qs)


def run_pure(shape: TreeShape, sampling: SamplingParams, mode: str, seed: int, verifier=verify_tree) -> np.ndarray:
    """Counts of the first W tokens over N_PURE generations by tree rounds."""
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)  # the verifier's draws, the drafter's
    counts = np.zeros((V,) * W, dtype=np.int64)
    for _ in range(N_PURE):
        out: tuple[int, ...] = ()
        while len(out) < W:
            tokens, parents, p, q = draw_tree(out, shape, sampling, mode, rng)
            path, extra = verifier(tokens, parents, p, q, gen)
            out += tuple(tokens[i] for i in path) + (extra,)
        counts[out[:W]] += 1
    return counts


def pure_law(sampling: SamplingParams) -> np.ndarray:
    law = np.zeros((V,) * W)
    for a in range(V):
        for b in range(V):
            law[a, b] = (p_of((), sampling)[a] * p_of((a,), sampling)[b] * p_of((a, b), sampling)).double().numpy()
    return law


def pure_verdict(counts: np.ndarray, sampling: SamplingParams) -> Verdict:
    law = pure_law(sampling)
    return Verdict(tv(counts, law), noise_floor(law, N_PURE, seed=12345), chi_square_pvalue(counts, law), None)


def no_residual_update(tokens, parents, p, q, generator):
    """Broken: after a sibling is rejected the next is tested against the same p (no residual update), and the
    last token is drawn from p itself."""
    kids = children_of(parents)
    node, path, cur = -1, [], p[0]
    while True:
        for child in kids.get(node, []):
            x = tokens[child]
            if torch.rand((), generator=generator) * q[child][x] < cur[x]:
                path.append(child)
                node, cur = child, p[child + 1]
                break
        else:
            return path, int(torch.multinomial(cur, 1, generator=generator))


def iid_rule_for_worep(tokens, parents, p, q, generator):
    """Broken for children drawn without replacement: every sibling is verified with the node's original q (the
    i.i.d. rule), not the q it was actually drawn from."""
    kids = children_of(parents)
    q = q.clone()
    for siblings in kids.values():
        for child in siblings[1:]:
            q[child] = q[siblings[0]]
    return verify_tree(tokens, parents, p, q, generator)


@pytest.mark.parametrize("mode,sampling,seed", [("worep", T07_P09, 3), ("det", T1, 4),
                                                pytest.param("iid", T1, 1, marks=pytest.mark.slow),
                                                pytest.param("worep", T1, 2, marks=pytest.mark.slow),
                                                pytest.param("iid", T07_P09, 5, marks=pytest.mark.slow),
                                                pytest.param("det", T07_P09, 6, marks=pytest.mark.slow)])
def test_tree_verification_matches_exact_law(mode, sampling, seed):
    verdict = pure_verdict(run_pure(SHAPE, sampling, mode, seed), sampling)
    print(f"\n[tree {mode} T={sampling.temperature} top_p={sampling.top_p}] {verdict}")
    assert verdict.passes, verdict


@pytest.mark.parametrize("mode,broken", [("iid", no_residual_update), ("worep", iid_rule_for_worep),
                                         pytest.param("worep", no_residual_update, marks=pytest.mark.slow)])
def test_broken_tree_verifiers_are_caught(mode, broken):
    verdict = pure_verdict(run_pure(SHAPE, T1, mode, 11, verifier=broken), T1)
    print(f"\n[broken {broken.__name__} {mode}] {verdict}")
    assert not verdict.passes, verdict


def test_tree_hand_computed():
    # Root children a=0 then b=1, deterministic (one-hot q). p0 = [.5, .3, .2, 0]: a accepted with .5; else b is
    # tried against p0 without a, [0, .6, .4, 0]: accepted with .6; else the token is 2. b has a child c=3 whose
    # p (row 2, after b) is one-hot at 3: whenever b is accepted, c is too, and the bonus comes from row 3.
    tokens, parents = [0, 1, 3], [-1, -1, 1]
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [1.0, 0, 0, 0], [0, 0, 0, 1.0], [0, 0, 1.0, 0]])
    seen: dict[tuple, int] = {}
    gen = torch.Generator().manual_seed(0)
    for _ in range(20000):
        path, extra = verify_tree(tokens, parents, p, None, gen)
        seen[(tuple(path), extra)] = seen.get((tuple(path), extra), 0) + 1
    assert set(seen) == {((0,), 0), ((1, 2), 2), ((), 2)}
    assert abs(seen[((0,), 0)] / 20000 - 0.5) < 0.015
    assert abs(seen[((1, 2), 2)] / 20000 - 0.3) < 0.015
    # greedy: follow the argmax; stop where no child has it
    assert verify_tree_greedy(tokens, parents, [1, 0, 3, 2]) == ([1, 2], 2)
    assert verify_tree_greedy(tokens, parents, [2, 0, 3, 2]) == ([], 2)
    assert verify_tree_greedy(tokens, parents, [0, 3, 3, 2]) == ([0], 3)


def test_tree_layout_and_parent_order():
    tree = tree_layout([-1, -1, 0])
    assert tree.positions.tolist() == [0, 1, 1, 2]
    assert tree.mask.int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    with pytest.raises(ValueError):
        tree_layout([-1, 2, 0])


# ---- the cache keeps the accepted path ---------------------------------------------------------------------------
def test_commit_path_moves_the_accepted_slots(tiny_target):
    cache = tiny_target.new_batch_cache(2, 16, 8)
    cache.commit(1, 3)
    for s in range(cache.capacity):
        cache.k[:, 1, :, s] = s
        cache.v[:, 1, :, s] = -s
    cache.commit_path(1, [0, 2, 5])
    assert cache.lengths == [0, 6]
    assert cache.k[0, 1, 0, :6, 0].tolist() == [0, 1, 2, 3, 5, 8]
    assert cache.v[0, 1, 0, :6, 0].tolist() == [0, -1, -2, -3, -5, -8]
    for bad in ([-1], [0, 0], [0, 3, 2]):
        with pytest.raises(ValueError):
            cache.commit_path(1, bad)


def test_draft_tree_probabilities_are_the_drafts_at_each_node(wide_target, wide_draft):
    """The drafter's depth-by-depth forwards (a tree mask reaching back over earlier depths) give each node the
    draft's distribution after its own path: each rank-0 child's q equals a fresh prefill's probabilities."""
    prompt = [3, 1, 4, 1, 5]
    sampling = SamplingParams(temperature=1.0)
    prop = TreeDraftProposer(wide_draft, 64, shape=SHAPE)
    prop.reset([0], [prompt])
    (proposal,) = prop.propose([0], [len(SHAPE)], [sampling], [torch.Generator().manual_seed(0)])
    tokens, parents = proposal.tokens.tolist(), proposal.parents.tolist()
    assert parents == list(SHAPE.parents)
    for i, parent in enumerate(parents):
        path, node = [], parent
        while node >= 0:
            path.insert(0, tokens[node])
            node = parents[node]
        if SHAPE.ranks[i] == 0:
            want = logits_to_probs(fresh_logits(wide_draft, prompt + path)[-1], sampling)
            torch.testing.assert_close(proposal.q[i], want, atol=1e-5, rtol=1e-4)
        else:  # a later sibling: the parent's q without the earlier siblings, renormalised
            assert proposal.q[i][tokens[i - 1]] == 0


def test_draw_children_without_replacement():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    tokens, qs = draw_children(logits, 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert len(set(tokens)) == 3
    for k in range(1, 3):
        assert all(qs[k][t] == 0 for t in tokens[:k]) and abs(float(qs[k].sum()) - 1) < 1e-6
    assert draw_children(logits, 2, SamplingParams(), torch.Generator())[0] == [0, 1]
    # top-k 2 leaves two tokens: a third child is not drawn
    assert len(draw_children(logits, 3, SamplingParams(temperature=1.0, top_k=2), torch.Generator())[0]) == 2


# ---- the tree strategy end to end ----------------------------------------------------------------------------------
SHAPES = [TreeShape.chain(3), TreeShape.from_paths([(0,), (1,)]), SHAPE,
          TreeShape.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 1), (0, 0, 0, 0)])]


@pytest.mark.parametrize("shape", SHAPES + [None], ids=lambda s: f"n{len(s)}" if s else "planned")
def test_tree_greedy_equals_plain_decoding(wide_target, wide_draft, shape):
    budget = len(shape) if shape is not None else 8
    accepted = 0
    for prompt in ([3, 1, 4, 1, 5], [7] * 6, [2, 9, 11, 30, 5, 5, 1]):
        plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=24)).token_ids
        prop = TreeDraftProposer(wide_draft, 64, shape=shape)
        got = generate(wide_target, prompt, GenerationParams(max_new_tokens=24, gamma=budget), prop)
        assert got.token_ids == plain, prompt
        accepted += got.metrics.accepted
    assert accepted > 10  # the draft's guesses really were kept (else the path commit went untested)


def test_committing_a_rejected_siblings_kv_is_caught(wide_target, wide_draft, monkeypatch):
    """Control: keeping the first slots the tree wrote instead of the accepted path's breaks greedy identity."""
    prompt = [3, 1, 4, 1, 5]
    plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=24)).token_ids
    monkeypatch.setattr(NativeRows, "commit_path", lambda self, r, offsets: self.commit(r, len(offsets)))
    prop = TreeDraftProposer(wide_draft, 64, shape=SHAPE)
    got = generate(wide_target, prompt, GenerationParams(max_new_tokens=24, gamma=len(SHAPE)), prop)
    assert got.token_ids != plain


def _tree_engine_verdict(target, draft, sampling, seed_base, tree_verifier=verify_tree) -> Verdict:
    law = exact_law(target, sampling)
    shape = TreeShape.from_paths([(0,), (1,), (0, 0), (1, 0)])
    run = sample_engine(target, None, sampling, len(shape), seed_base,
                        make_proposer=lambda max_len, rows: TreeDraftProposer(draft, max_len, rows=rows, shape=shape),
                        tree_verifier=tree_verifier)
    from tests.test_losslessness import N
    return Verdict(tv(run.counts, law), noise_floor(law, N, seed=12345), chi_square_pvalue(run.counts, law), run.alpha)


@pytest.mark.parametrize("sampling,seed_base", [pytest.param(T1, 21_000_000, marks=pytest.mark.slow),
                                                 (T07_P09, 22_000_000)], ids=["T1", "T07-p09"])
def test_tree_strategy_keeps_the_target_law(tiny_target, tiny_draft, sampling, seed_base):
    verdict = _tree_engine_verdict(tiny_target, tiny_draft, sampling, seed_base)
    print(f"\n[tree engine T={sampling.temperature} top_p={sampling.top_p}] {verdict}")
    assert verdict.passes, verdict


def test_tree_strategy_with_a_broken_verifier_is_caught(tiny_target, tiny_draft):
    verdict = _tree_engine_verdict(tiny_target, tiny_draft, T1, 21_000_000, tree_verifier=no_residual_update)
    print(f"\n[tree engine, no residual update] {verdict}")
    assert not verdict.passes, verdict


# ---- the planner -------------------------------------------------------------------------------------------------
def test_a_chain_is_the_tree_of_one_rank():
    for alpha in (0.3, 0.7, 0.95):
        for n in (1, 4, 8):
            shape = best_tree([alpha], n)
            assert shape == TreeShape.chain(n)
            assert abs(expected_tree_tokens(shape, [alpha]) - expected_tokens(alpha, n)) < 1e-12
            assert abs(tree_cost(shape, 0.3) - (n * 0.3 + 1)) < 1e-12


def test_best_tree_takes_the_most_valuable_nodes():
    r = [0.6, 0.3]
    shape = best_tree(r, 3)  # values: (0,) .6, (1,) .3, (0,0) .36 -> the chain of two and the second root child
    assert set(zip(shape.parents, shape.ranks)) == {(-1, 0), (-1, 1), (0, 0)}
    assert abs(expected_tree_tokens(shape, r) - (1 + 0.6 + 0.3 + 0.36)) < 1e-12


def test_planner_says_chain_on_a_steep_cost_curve_and_tree_when_verification_is_flat():
    r = [0.6, 0.2, 0.1]
    steep = interpolate_cost([(1, 1.0), (2, 1.4), (5, 2.6), (9, 4.2)])  # the AVX2 build's, before its fixes
    shape, speed = plan_tree(r, 8, 0.05, steep)
    assert all(rank == 0 for rank in shape.ranks) and speed > 1  # a chain
    flat, _ = plan_tree(r, 8, 0.05)
    assert any(rank > 0 for rank in flat.ranks) and len(flat) == 8  # a GPU: use the whole budget, wide


# ---- tree+ngram: prompt lookup first, the tree elsewhere -----------------------------------------------------------
class _CountingTreeMix(DraftNgramProposer):
    """Counts the tree proposals it hands out (rounds the draft model drafted), beside the n-gram rounds."""

    tree_rounds = 0

    def propose(self, rows, gammas, sampling, generators, shapes=None):
        out = super().propose(rows, gammas, sampling, generators, shapes)
        self.tree_rounds += sum(p.parents is not None for p in out)
        return out


@pytest.mark.parametrize("gamma", [3, 7])
def test_tree_ngram_greedy_equals_plain_and_the_draft_catches_up(wide_target, wide_draft, gamma):
    """Both kinds of round happen and the output is plain decoding's; after the rounds the lookup drafted (the draft
    model ran nothing then), the tree's first q is still the draft's fresh law over the whole text."""
    repetitive = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    tree_rounds = ngram_rounds = 0
    for prompt in ([3, 1, 4, 1, 5], [2, 9, 11, 30, 5, 5, 1], repetitive):
        plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=30)).token_ids
        mix = _CountingTreeMix(TreeDraftProposer(wide_draft, 64), 3, min_match=2)
        assert generate(wide_target, prompt, GenerationParams(max_new_tokens=30, gamma=gamma), mix).token_ids == plain
        tree_rounds, ngram_rounds = tree_rounds + mix.tree_rounds, ngram_rounds + mix.ngram_rounds
    assert tree_rounds >= 3 and ngram_rounds >= 2
    mix = DraftNgramProposer(TreeDraftProposer(wide_draft, 64, shape=TreeShape.chain(1)), 3, min_match=2)
    text = text_after_lookup_rounds(wide_target, mix, repetitive, gamma)
    t1 = SamplingParams(temperature=1.0)
    (proposal,) = mix.draft.propose([0], [1], [t1], [torch.Generator().manual_seed(0)])
    fresh = fresh_logits(wide_draft, text)[-1]
    torch.testing.assert_close(proposal.q[0], logits_to_probs(fresh, t1), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("sampling,seed_base", [(T07_P09, 23_000_000)], ids=["T07-p09"])
def test_tree_ngram_keeps_the_target_law(tiny_target, tiny_draft, sampling, seed_base):
    """On a prompt that repeats itself both the lookup and the tree draft inside the compared window, and the
    law of the first W tokens is the target's (against the measured noise floor)."""
    mixes: list[_CountingTreeMix] = []

    def make(max_len: int, rows: int) -> DraftNgramProposer:
        shape = TreeShape.from_paths([(0,), (1,), (0, 0)])
        mixes.append(_CountingTreeMix(TreeDraftProposer(tiny_draft, max_len, rows=rows, shape=shape), 3,
                                      min_match=3))
        return mixes[-1]

    verdict = lossless_verdict(tiny_target, make, sampling, 3, seed_base, "tree+ngram")
    tree_rounds, ngram_rounds = sum(m.tree_rounds for m in mixes), sum(m.ngram_rounds for m in mixes)
    print(f"n-gram rounds {ngram_rounds}, tree rounds {tree_rounds}")
    assert ngram_rounds > 100 and tree_rounds > 100, (ngram_rounds, tree_rounds)
    assert verdict.passes, verdict
