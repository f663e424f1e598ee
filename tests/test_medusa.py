"""Medusa heads: their guesses against the target's features of a fresh prefill, greedy identity and the sampled law
through the round, training (agreement goes up), the heads directory, and `verispec train-drafter --kind medusa`."""

from __future__ import annotations

import json

import pytest
import torch

from tests.test_cli import pair, run_inline  # noqa: F401 - the tiny HF pair fixture
from tests.test_eagle import continuations, fit, target_features
from tests.test_losslessness import T07_P09, check
from verispec.engine import Batch, GenerationParams, generate
from verispec.models.medusa import MedusaConfig, MedusaHeads, load_heads
from verispec.proposers.medusa import MedusaPlan, MedusaProposer
from verispec.sampling import SamplingParams, logits_to_probs
from verispec.train_drafter import medusa_losses


def train_tiny(target, heads: int = 3, steps: int = 300, seed: int = 0) -> MedusaHeads:
    """Heads fitted to the target's own greedy continuations (a few seconds on a tiny model)."""
    cfg = MedusaConfig.for_target(target, "tiny", heads=heads, head_vocab=target.vocab_size)
    model = MedusaHeads.fresh(cfg, target, target.lm_head.weight)
    feats = torch.stack([target_features(target, s) for s in continuations(target, seed)])
    return fit(model, target, lambda m, head: medusa_losses(m, head, feats)[0], steps)


@pytest.fixture(scope="module")
def medusa(wide_target) -> MedusaHeads:
    return train_tiny(wide_target)


PROMPTS = [[12, 15, 21, 0, 21, 15], [7], [3, 27, 3, 7, 2, 31, 1, 30, 29]]


def test_training_raises_agreement(wide_target, medusa):
    fresh = MedusaHeads.fresh(MedusaConfig.for_target(wide_target, "tiny", heads=3, head_vocab=wide_target.vocab_size),
                              wide_target, wide_target.lm_head.weight)
    feats = torch.stack([target_features(wide_target, s) for s in continuations(wide_target)[:6]])
    with torch.no_grad():
        before = medusa_losses(fresh, fresh.lm_head.weight, feats)
        after = medusa_losses(medusa, medusa.lm_head.weight, feats)
    # a random tiny model's token t+2 is hard to read off h_t alone (the heads never see token t+1): 0.04 -> 0.12
    assert after[0] < 0.7 * before[0] and after[1] > before[1] + 0.06, (before, after)


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_medusa_greedy_equals_plain_decoding(wide_target, medusa, gamma):
    """gamma 5 asks for more than the 3 heads guess: the chain stops at 3."""
    accepted = 0
    for prompt in PROMPTS:
        plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=30)).token_ids
        got = generate(wide_target, prompt, GenerationParams(max_new_tokens=30, gamma=gamma),
                       MedusaProposer(medusa, wide_target.vocab_size))
        assert got.token_ids == plain, prompt
        accepted += got.metrics.accepted
    assert accepted >= 5  # the heads were trained: some guesses were kept (the feature bookkeeping ran)


@pytest.mark.parametrize("widths,gamma", [((2,), 2), ((2, 2), 6), ((3, 1, 1), 5), ((2, 2, 2), 14)])
def test_medusa_trees_equal_plain_decoding(wide_target, medusa, widths, gamma):
    accepted = 0
    for prompt in PROMPTS:
        plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=30)).token_ids
        got = generate(wide_target, prompt, GenerationParams(max_new_tokens=30, gamma=gamma),
                       MedusaProposer(medusa, wide_target.vocab_size, widths=widths))
        assert got.token_ids == plain, prompt
        accepted += got.metrics.accepted
    assert accepted >= 5


def test_planned_medusa_trees_equal_plain_decoding_and_follow_the_cost(wide_target, medusa):
    """Widths planned per round: greedy output equals plain decoding; where verifying is free the planner drafts
    (trees), where each verified token costs a whole forward it decodes plainly, and either way the heads'
    choices are scored against the target's tokens (head 0's rank-0 hits rise above the prior)."""
    free = MedusaPlan(verify_cost=lambda k: 1.0, c=0.0)
    steep = MedusaPlan(verify_cost=lambda k: float(k), c=0.1)
    for plan, drafts in ((free, True), (steep, False)):
        drafted, widths = 0, set()
        for prompt in PROMPTS:
            plain = generate(wide_target, prompt, GenerationParams(max_new_tokens=30)).token_ids
            proposer = MedusaProposer(medusa, wide_target.vocab_size, plan=plan)
            batch = Batch(wide_target, 1, 64, slack=16)
            seq = batch.add(prompt, GenerationParams(max_new_tokens=30, gamma=8), proposer)
            while batch.live:
                batch.round()
                if seq.started and 0 in proposer.counts:
                    widths.add(proposer.counts[0].widths)
            assert seq.out == plain, prompt
            drafted += seq.metrics.drafted
        assert (drafted > 0) == drafts and (any(len(w) for w in widths)) == drafts, widths


def test_planner_scores_the_heads_against_the_targets_tokens(wide_target, medusa):
    """With no prior and no forgetting, the planner's estimates are the heads' hit rates by rank, recomputed here
    from a fresh prefill: head 0 at the feature that chose each pending token against the token after it (the
    steep cost keeps every round a plain step, so head 1 is never scored)."""
    plan = MedusaPlan(verify_cost=lambda k: float(k), c=0.1, prior_weight=1e-6, decay=1.0)
    proposer = MedusaProposer(medusa, wide_target.vocab_size, plan=plan)
    batch = Batch(wide_target, 1, 64, slack=16)
    prompt = PROMPTS[2]
    seq = batch.add(prompt, GenerationParams(max_new_tokens=30, gamma=8), proposer)
    seen = []
    while batch.live:
        batch.round()
        if 0 in proposer.counts:
            seen.append(proposer.accept(0))
    text = prompt + seq.out
    h = target_features(wide_target, text)
    ranks = []
    # the proposer starts after the first (plain) round; `seen` misses the last round (its row is freed at once)
    for n in range(len(prompt) + 1, len(text) - 1):
        with torch.no_grad():
            top = torch.topk(medusa(h[n - 2 : n - 1])[0, 0, : wide_target.vocab_size], 4).indices.tolist()
        ranks.append(top.index(text[n]) if text[n] in top else None)
    want = [sum(r == j for r in ranks) / len(ranks) for j in range(4)]
    assert seen[-1][0] == pytest.approx(want, abs=1e-5), (seen[-1][0], want)
    assert seen[-1][1] == pytest.approx([0.18, 0.036, 0.018, 0.012])  # the prior's ratios, never scored


@pytest.fixture(scope="module")
def tiny_heads(tiny_target) -> MedusaHeads:
    return train_tiny(tiny_target, steps=150)


def test_medusa_tree_shape(tiny_target, tiny_heads):
    """2 x 2 children, breadth first, each sibling group drawn without replacement with its q; a budget cuts it."""
    proposer = MedusaProposer(tiny_heads, tiny_target.vocab_size, widths=(2, 2))
    proposer.reset([0], [[4, 4, 1]], None, [target_features(tiny_target, [4, 4])])
    (tree,) = proposer.propose([0], [6], [T07_P09], [torch.Generator().manual_seed(0)])
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1, 1] and tree.q.shape == (6, tiny_target.vocab_size)
    assert tree.tokens[0] != tree.tokens[1] and tree.tokens[2] != tree.tokens[3]  # without replacement
    assert float(tree.q[1][tree.tokens[0]]) == 0.0 and float(tree.q[0][tree.tokens[0]]) > 0  # q minus earlier sibling
    (cut,) = proposer.propose([0], [3], [SamplingParams()], [torch.Generator()])
    assert cut.parents.tolist() == [-1, -1, 0] and cut.q is None


@pytest.mark.slow
def test_medusa_tree_keeps_the_target_law(tiny_target, tiny_heads):
    """A tree of 2 x 2 children keeps the target's law (children drawn without replacement from each head)."""
    heads = tiny_heads
    verdict = check(tiny_target, None, T07_P09, 6, 33_000_000, label="medusa tree 2x2",
                    make_proposer=lambda max_len, rows: MedusaProposer(heads, tiny_target.vocab_size, widths=(2, 2)))
    assert verdict.passes, verdict


def test_medusa_rows_of_a_batch_equal_generate_alone(wide_target, medusa):
    batch = Batch(wide_target, 3, 64, slack=8)
    proposer = MedusaProposer(medusa, wide_target.vocab_size)
    seqs = [batch.add(p, GenerationParams(max_new_tokens=30, gamma=1 + i), proposer) for i, p in enumerate(PROMPTS)]
    while batch.live:
        batch.round()
    for seq, prompt in zip(seqs, PROMPTS):
        assert seq.out == generate(wide_target, prompt, GenerationParams(max_new_tokens=30)).token_ids


def test_guesses_read_the_feature_that_chose_the_pending_token(wide_target, medusa):
    """After each round, every head's q equals the heads on h at the second-to-last position of a fresh prefill of
    the whole text (the feature whose LM head chose the last token): the wrong feature would show."""
    sampling = SamplingParams(temperature=1.0)
    prompt = [3, 1, 4, 1, 5]
    proposer = MedusaProposer(medusa, wide_target.vocab_size)
    batch = Batch(wide_target, 1, 64, slack=8)
    seq = batch.add(prompt, GenerationParams(max_new_tokens=30, gamma=3, sampling=sampling, seed=3), proposer)
    for _ in range(6):
        batch.round()
        if not seq.started:  # its first round was a plain step; the proposer starts with the next
            continue
        text = prompt + seq.out
        (proposal,) = proposer.propose([0], [3], [sampling], [torch.Generator().manual_seed(0)])
        h = target_features(wide_target, text[:-1])[-1]
        want = logits_to_probs(medusa(h[None])[0], sampling)
        torch.testing.assert_close(proposal.q, want, atol=1e-5, rtol=1e-4)
        wrong = logits_to_probs(medusa(target_features(wide_target, text[:-2])[-1][None])[0], sampling)
        assert not torch.allclose(proposal.q, wrong, atol=1e-3)


def test_medusa_keeps_the_target_law(tiny_target):
    heads = train_tiny(tiny_target, steps=150)
    verdict = check(tiny_target, None, T07_P09, 3, 31_000_000, label="medusa",
                    make_proposer=lambda max_len, rows: MedusaProposer(heads, tiny_target.vocab_size))
    # the law check must see drafts accepted: α was 0.20 here with either categorical sampler (one seed)
    assert verdict.alpha is not None and verdict.alpha > 0.15, verdict
    assert verdict.passes, verdict


def test_heads_beside_a_bf16_target_keep_greedy_identity(wide_target, medusa, tmp_path):
    """Beside a bfloat16 target (`--dtype bfloat16`, a GPU's default) the heads run on the target's device and
    read its bf16 features."""
    import copy

    target = copy.deepcopy(wide_target).to(torch.bfloat16)
    medusa.save(tmp_path / "d")
    heads = load_heads(tmp_path / "d", target)
    assert heads.lm_head.weight.device == target.device and heads.norm is target.norm
    accepted = 0
    for prompt in ([12, 15, 21, 0, 21, 15], [3, 27, 3, 7, 2, 31, 1, 30, 29]):
        plain = generate(target, prompt, GenerationParams(max_new_tokens=20))
        spec = generate(target, prompt, GenerationParams(max_new_tokens=20, gamma=3),
                        MedusaProposer(heads, target.vocab_size))
        assert spec.token_ids == plain.token_ids, prompt
        accepted += spec.metrics.accepted
    assert accepted > 0


def test_heads_directory_round_trip(wide_target, medusa, tmp_path):
    medusa.save(tmp_path / "d")
    saved = json.loads((tmp_path / "d" / "config.json").read_text())
    assert saved["kind"] == "medusa" and saved["heads"] == 3
    again = load_heads(tmp_path / "d", wide_target)
    assert again.norm is wide_target.norm  # shared, not copied
    h = target_features(wide_target, [9, 9, 9])
    torch.testing.assert_close(again(h), medusa(h))
    from verispec.models.errors import ModelError

    (tmp_path / "bad").mkdir()
    with pytest.raises(ModelError, match="not a Medusa heads directory"):
        load_heads(tmp_path / "bad", wide_target)


def test_train_drafter_medusa_trains_resumes_and_drafts(pair, capsys, tmp_path):  # noqa: F811
    target, _ = pair
    out, features = tmp_path / "heads", tmp_path / "features"
    common = ["train-drafter", "--kind", "medusa", "--heads", "3", "--target", str(target), "--dtype", "float32",
              "--out", str(out), "--features", str(features), "--tokens", "2048", "--seq-len", "32", "--batch", "2"]
    code, stdout, err = run_inline(capsys, *common, "--budget", "1s")
    assert code == 0, err
    assert "--strategy medusa" in stdout and (out / "model.safetensors").is_file()
    assert len(list(features.iterdir())) == 4 and not (out / "features").exists()
    code, stdout, err = run_inline(capsys, *common, "--budget", "2s")
    assert code == 0 and "resuming at step" in err, err
    plain = run_inline(capsys, "generate", "def x ( a ) :", "--target", str(target), "--dtype", "float32",
                       "--strategy", "ar", "--max-new-tokens", "20", "--json")
    spec = run_inline(capsys, "generate", "def x ( a ) :", "--target", str(target), "--dtype", "float32",
                      "--strategy", "medusa", "--drafter", str(out), "--gamma", "3", "--max-new-tokens", "20", "--json")
    planned = run_inline(capsys, "generate", "def x ( a ) :", "--target", str(target), "--dtype", "float32",
                         "--strategy", "medusa", "--drafter", str(out), "--medusa-tree", "auto", "--gamma", "6",
                         "--max-new-tokens", "20", "--json")
    assert plain[0] == 0 and spec[0] == 0 and planned[0] == 0, spec[2] + planned[2]
    assert json.loads(spec[1])["token_ids"] == json.loads(plain[1])["token_ids"] == json.loads(planned[1])["token_ids"]
    code, _, err = run_inline(capsys, "generate", "hi", "--target", str(target), "--strategy", "medusa",
                              "--drafter", str(out), "--medusa-tree", "2,1,1,1")
    assert code == 2 and "--medusa-tree gives 4 depths" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_inline(capsys, "generate", "hi", "--target", str(target), "--strategy", "medusa",
                              "--drafter", str(features))
    assert code == 2 and "not a drafter directory" in err and len(err.strip().splitlines()) == 1
    eagle = ["--kind", "eagle", "--out", str(out)]  # an EAGLE run into the heads' directory is refused
    code, _, err = run_inline(capsys, *[a for a in common if a not in ("--kind", "medusa")], *eagle, "--budget", "1s")
    assert code == 2 and "not an EAGLE one" in err, err


def test_heads_beside_a_target_that_returns_eagle3_features_read_its_last_block(wide_target, medusa):
    """A target whose forwards also return the outputs of its first blocks (for an EAGLE-3 drafter): the heads read
    the last block's output, the last H columns, and accept what they accept beside the plain target."""
    import copy

    tapped = copy.deepcopy(wide_target)
    tapped.feature_layers = (1,)
    for prompt in PROMPTS:
        runs = [generate(t, prompt, GenerationParams(max_new_tokens=30, gamma=3),
                         MedusaProposer(medusa, wide_target.vocab_size)) for t in (wide_target, tapped)]
        assert runs[0].token_ids == runs[1].token_ids
        assert runs[0].metrics.accepted == runs[1].metrics.accepted
