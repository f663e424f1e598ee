"""`verispec audit`: passes on correct configurations, and fails, naming the first bad position, against a broken
verifier and against a target whose rows depend on the forward's width (a batch-dependent kernel)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import noisy_copy
from tests.test_cli import pair, run_inline  # noqa: F401 - the tiny HF pair fixture
from tests.test_losslessness import bonus_off_by_one, residual_is_p
from verispec.audit import AuditReport, GreedyCase, greedy_identity, law_check, law_prompt, two_sample_tv
from verispec.engine import GenerationParams
from verispec.proposers.draft_model import DraftModelProposer
from verispec.sampling import SamplingParams

PROMPTS = [("a", [12, 15, 21, 0]), ("b", [7]), ("c", [3, 27, 3, 7, 2, 31])]
PARAMS = GenerationParams(max_new_tokens=24, gamma=3)


def drafts(draft):
    return lambda max_len, rows: DraftModelProposer(draft, max_len, rows=rows)


class WidthDependent(torch.nn.Module):
    """The target, except that a forward of several new tokens shifts its later rows' logits: what a kernel whose
    rows depend on the row count does to verification (decoding steps, one token wide, are untouched)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def forward(self, tokens, *args, **kwargs):
        out = self.inner.forward(tokens, *args, **kwargs)
        logits = out[0] if isinstance(out, tuple) else out
        if tokens.shape[-1] > 1 and logits.shape[-2] > 1:
            shift = torch.zeros_like(logits)
            shift[..., 1:, :] = 3.0 * torch.sin(torch.arange(logits.shape[-1], dtype=logits.dtype))
            logits = logits + shift
        return (logits, *out[1:]) if isinstance(out, tuple) else logits


def test_correct_configuration_passes(wide_target, wide_draft, tiny_target, tiny_draft):
    greedy = greedy_identity(wide_target, drafts(wide_draft), PROMPTS, PARAMS)
    assert all(c.identical and c.tokens == 24 for c in greedy)
    best = max(greedy, key=lambda c: c.accepted / (len(dict(PROMPTS)[c.prompt]) + c.tokens))
    name, ids = law_prompt(wide_target, PROMPTS, greedy, SamplingParams(temperature=1.0))
    assert best.accepted > 0 and name.startswith(best.prompt)
    assert ids[: len(dict(PROMPTS)[best.prompt])] == dict(PROMPTS)[best.prompt]
    assert ids[len(dict(PROMPTS)[best.prompt]):] == best.output[: len(ids) - len(dict(PROMPTS)[best.prompt])]
    law = law_check(tiny_target, drafts(tiny_draft), "p", [1, 2], SamplingParams(temperature=1.0), tokens=2,
                    samples=400, gamma=2, seed=7)
    assert law.passed and law.alpha > 0.3, law
    report = AuditReport({}, greedy, law)
    assert report.passed and report.verdict.startswith("PASS: greedy identity 3/3")
    ended = AuditReport({}, [GreedyCase("x", 5, False, 5, 7, None, 1.5, None)], None)
    assert "plain token 7 logit 1.5000, speculative token (ended)" in ended.verdict  # one output stopped early


def test_width_dependent_rows_fail_greedy_identity_at_a_named_position(wide_target, wide_draft):
    cases = greedy_identity(WidthDependent(wide_target), drafts(wide_draft), PROMPTS, PARAMS)
    bad = [c for c in cases if not c.identical]
    assert bad, cases
    case = bad[0]
    assert case.position is not None and case.plain_token != case.spec_token
    assert case.plain_logit is not None and case.plain_logit >= case.spec_logit  # plain took the argmax
    report = AuditReport({}, cases, None)
    assert not report.passed and f"prompt {case.prompt}, position {case.position}" in report.verdict


@pytest.mark.parametrize("verifier", [residual_is_p, bonus_off_by_one])
def test_broken_verifiers_fail_the_law_check(tiny_target, verifier):
    """Greedy decoding never reaches the sampled verifier: the sampled-law check must catch these (residuals: with a
    draft that is often wrong, alpha ~0.4, so rejections are frequent; the bonus: with one often right, so rounds
    that accept every draft are)."""
    draft = noisy_copy(tiny_target, noise=1.0 if verifier is residual_is_p else 0.2, seed=7)
    assert all(c.identical for c in greedy_identity(tiny_target, drafts(draft), [("t", [1, 2, 3])], PARAMS,
                                                    verifier=verifier))
    law = law_check(tiny_target, drafts(draft), "p", [4, 4, 1], SamplingParams(temperature=1.0), tokens=3,
                    samples=400, gamma=3 if verifier is residual_is_p else 1, seed=7, verifier=verifier)
    assert not law.passed, law
    worst = min(law.tests, key=lambda t: t.p_value)
    assert worst.tv > worst.detectable_tv
    assert not AuditReport({}, [], law).passed


def test_two_sample_tv_has_the_stated_size():
    """Under the null (both arms from one law) the test rejects about as often as its level says."""
    rng = torch.Generator().manual_seed(0)
    law = torch.tensor([0.4, 0.3, 0.2, 0.1])
    rejections = 0
    for i in range(40):
        a, b = (torch.multinomial(law, 300, True, generator=rng).tolist() for _ in range(2))
        rejections += two_sample_tv(a, b, permutations=200, seed=i)[2] < 0.05
    assert rejections <= 6  # 2 expected at 5%


def test_audit_command(pair, capsys, tmp_path):  # noqa: F811
    target, draft = pair
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["def x ( a ) :", "if x = 1 :"]))
    common = ["audit", "--target", str(target), "--draft", str(draft), "--dtype", "float32", "--prompts", str(prompts)]
    code, stdout, err = run_inline(capsys, *common, "--strategy", "draft", "--samples", "40", "--law-tokens", "2",
                                   "--max-new-tokens", "16", "--json", str(tmp_path / "r.json"))
    assert code == 0, err
    assert stdout.startswith("PASS: greedy identity 2/2 prompts; sampled law of 2 tokens after")
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] and report["config"]["strategy"] == "draft" and len(report["law"]["tests"]) == 3
    code, _, err = run_inline(capsys, *common, "--strategy", "ar")
    assert code == 2 and "nothing to audit" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_inline(capsys, *common, "--temperature", "0")
    assert code == 2 and "--temperature > 0" in err
