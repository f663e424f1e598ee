"""Drafts from a model with another tokenizer (`--strategy cross`): the draft's text, re-tokenized, is verified as
a deterministic proposal.

The draft here is the tiny target itself under a permuted vocabulary (its tokenizer and its embedding and output
rows permuted alike): the same model in text space, so with greedy decoding a proposal is the target's own continuation
wherever the text survives re-tokenization, and is accepted: most are, which shows the path works. A
random draft of another vocabulary checks greedy identity and the sampled law where proposals are mostly wrong.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.test_losslessness import T1, check
from tests.tiny_hf import make_tiny_hf_dir
from verispec.engine import GenerationParams, generate
from verispec.models.load import load
from verispec.proposers.base import PerRow
from verispec.proposers.cross import CrossTokenizerProposer, common_prefix
from verispec.sampling import SamplingParams
from verispec.strategies import make_proposer


def permuted_copy(src: Path, dst: Path, seed: int) -> Path:
    """The model at src under a permuted vocabulary: word ids shuffled in tokenizer.json, and the embedding and
    LM-head rows moved with them."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tok = json.loads((dst / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    special = {t["content"] for t in tok.get("added_tokens", [])} | {"<unk>", "user", "assistant", "\n"}
    words = sorted((i, w) for w, i in vocab.items() if w not in special)
    ids = [i for i, _ in words]
    shuffled = [ids[j] for j in torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed)).tolist()]
    new_id = dict(zip(ids, shuffled))  # old id -> new id
    tok["model"]["vocab"] = {w: new_id.get(i, i) for w, i in vocab.items()}
    (dst / "tokenizer.json").write_text(json.dumps(tok))
    perm = torch.arange(len(vocab))
    for old, new in new_id.items():
        perm[new] = old  # row `new` of the new tables is row `old` of the old ones
    for f in dst.glob("*.safetensors"):
        state = load_file(str(f))
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in state:
                state[name] = state[name][perm].contiguous()
        save_file(state, str(f), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def trio(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross")
    target = make_tiny_hf_dir(root / "target", seed=0)
    same = permuted_copy(target, root / "permuted", seed=1)
    other = permuted_copy(make_tiny_hf_dir(root / "other", seed=4), root / "other-permuted", seed=2)
    return tuple(load(str(d), dtype="float32", progress=False) for d in (target, same, other))


PROMPTS = ("def x ( a ) :", "for a in b :", "if x = 1 :")


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([], [1]) == 0 and common_prefix([5], [5]) == 1


def test_the_vocabularies_really_differ(trio):
    target, same, _ = trio
    assert target.tokenizer.encode(PROMPTS[0]) != same.tokenizer.encode(PROMPTS[0])
    assert target.tokenizer.decode(target.tokenizer.encode(PROMPTS[0])) == same.tokenizer.decode(
        same.tokenizer.encode(PROMPTS[0]))


@pytest.mark.parametrize("which", ["same model", "other model"])
def test_cross_greedy_equals_plain_decoding(trio, which):
    target, same, other = trio
    draft = same if which == "same model" else other
    accepted = drafted = 0
    for text in PROMPTS:
        prompt = target.tokenizer.encode(text)
        params = GenerationParams(max_new_tokens=30, eos_ids=target.tokenizer.eos_ids)
        plain = generate(target.model, prompt, params)
        proposer = make_proposer("cross", target, draft, 64)
        got = generate(target.model, prompt, GenerationParams(**{**params.__dict__, "gamma": 4}), proposer)
        assert got.token_ids == plain.token_ids
        accepted, drafted = accepted + got.metrics.accepted, drafted + got.metrics.drafted
    assert drafted > 0
    if which == "same model":  # the same text, re-tokenized: proposals are right but where the tiny word-level
        # tokenizer cannot re-encode its own text (its "\n" token; whitespace is dropped when encoding)
        assert accepted / drafted > 0.7 and accepted > 15, (accepted, drafted)


def test_rows_of_a_batch_equal_generate_alone(trio):
    from verispec.engine import Batch

    target, same, other = trio
    tok = target.tokenizer
    params = GenerationParams(max_new_tokens=20, gamma=3, eos_ids=tok.eos_ids)
    alone = [generate(target.model, tok.encode(t), params).token_ids for t in PROMPTS]
    for draft in (same, other):
        batch = Batch(target.model, len(PROMPTS), 64, slack=8)
        proposer = make_proposer("cross", target, draft, 64, rows=len(PROMPTS))
        seqs = [batch.add(tok.encode(t), params, proposer) for t in PROMPTS]
        while batch.live:
            batch.round()
        assert [s.out for s in seqs] == alone


@pytest.mark.slow  # 8 s; the one-hot verification it rests on is tested by default (test_ngram)
def test_cross_keeps_the_sampled_law(trio):
    target, same, _ = trio
    prompt = target.tokenizer.encode(PROMPTS[0])
    # the tiny target's law over 3 tokens after this prompt, against runs drafted by the permuted copy
    from tests.test_losslessness import chi_square_pvalue, exact_law, noise_floor, sample_engine, tv, N

    law = exact_law(target.model, T1, prompt)
    run = sample_engine(target.model, None, T1, 3, 61_000_000, prompt=prompt, n=N,
                        make_proposer=lambda max_len, rows: make_proposer("cross", target, same, max_len, rows=rows))
    floor = noise_floor(law, N, seed=12345)
    assert run.alpha is not None and run.alpha > 0.1  # a greedy draft against T = 1: accepted at p(x)
    assert tv(run.counts, law) <= floor.threshold and chi_square_pvalue(run.counts, law) > 1e-3


def test_other_strategies_refuse_a_pair_of_two_tokenizers(trio, capsys, tmp_path):
    from tests.test_cli import run_inline

    target, _, other = trio
    code, _, err = run_inline(capsys, "generate", "x", "--target", str(target.path), "--draft", str(other.path),
                              "--dtype", "float32", "--draft-dtype", "float32", "--strategy", "draft")
    assert code == 2 and "--strategy cross" in err, err
    code, out, err = run_inline(capsys, "generate", "def x ( a ) :", "--target", str(target.path), "--draft",
                                str(other.path), "--dtype", "float32", "--draft-dtype", "float32", "--strategy",
                                "cross", "--json", "--max-new-tokens", "8")
    assert code == 0, err
    assert json.loads(out)["strategy"] == "cross"
