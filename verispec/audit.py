"""A losslessness audit a user runs on their own configuration (`verispec audit`).

Two checks, through the same round every command runs:

- **greedy identity**: on every prompt, speculative greedy output must equal plain greedy decoding of the same
  target token for token. Where it does not, the report names the first differing position, both tokens and the
  target's logits for each there (a near-tie says "rounding", a wide gap says "bug").
- **sampled law**: many seeded samples of the first k tokens of one prompt, with and without speculation, compared
  by a two-sample permutation test on the total variation (TV) between their empirical laws, for the k-token
  sequences and for each position's token. The report states the test's power as the TV it would flag at this N
  (the 95th percentile of its null distribution): a smaller difference in law can pass unseen.

A pass is evidence, not proof; a fail is a reproducible counterexample. Exit status 0/1 makes it a CI step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from verispec.engine import Batch, GenerationParams, NewSequence, generate
from verispec.models.base import CausalLM
from verispec.proposers.base import Proposer
from verispec.sampling import SamplingParams, logits_to_probs
from verispec.verify import ChainVerifier, verify_chain

# (max_len) -> a proposer serving `rows` rows of sequences up to max_len tokens
ProposerFactory = Callable[[int, int], Proposer | None]


@dataclass
class GreedyCase:
    prompt: str  # the prompt's id
    tokens: int  # tokens compared
    identical: bool
    position: int | None = None  # first differing position (0 = the first new token)
    plain_token: int | None = None
    spec_token: int | None = None
    plain_logit: float | None = None  # the target's logits for both tokens at that position
    spec_logit: float | None = None
    drafted: int = 0  # the speculative run's drafted and accepted tokens (a prompt where nothing was drafted
    accepted: int = 0  # tests nothing)
    output: list[int] = field(default_factory=list)  # plain decoding's tokens


@dataclass
class LawTest:
    name: str  # "tokens 1-3" (the joint law) or "token 2" (one position's marginal)
    tv: float  # between the two empirical laws
    detectable_tv: float  # the 95th percentile of TV under the null at this N: what the test would flag
    p_value: float


@dataclass
class LawCheck:
    prompt: str
    samples: int  # per arm
    tokens: int  # k
    sampling: dict
    tests: list[LawTest]
    alpha: float | None  # acceptance in the speculative arm (a check where nothing was drafted proves nothing)
    passed: bool = False


@dataclass
class AuditReport:
    config: dict
    greedy: list[GreedyCase]
    law: LawCheck | None
    passed: bool = field(init=False)

    def __post_init__(self) -> None:
        self.passed = all(c.identical for c in self.greedy) and (self.law is None or self.law.passed)

    @property
    def verdict(self) -> str:
        same = sum(c.identical for c in self.greedy)
        line = f"greedy identity {same}/{len(self.greedy)} prompts"
        bad = next((c for c in self.greedy if not c.identical), None)
        if bad is not None:
            def token(t: int | None, logit: float | None) -> str:
                return "(ended)" if t is None else f"{t} logit {logit:.4f}"

            line += (f" (first failure: prompt {bad.prompt}, position {bad.position}: plain token "
                     f"{token(bad.plain_token, bad.plain_logit)}, speculative token "
                     f"{token(bad.spec_token, bad.spec_logit)})")
        if self.law is not None:
            worst = min(self.law.tests, key=lambda t: t.p_value)
            line += (f"; sampled law of {self.law.tokens} tokens after {self.law.prompt}, {self.law.samples} "
                     f"samples per arm: "
                     f"{'passes' if self.law.passed else 'FAILS'} (smallest p {worst.p_value:.3g} on {worst.name}, "
                     f"TV {worst.tv:.3f}; it would flag TV above {worst.detectable_tv:.3f})")
        return ("PASS: " if self.passed else "FAIL: ") + line

    def to_dict(self) -> dict:
        return {"passed": self.passed, "verdict": self.verdict, "config": self.config,
                "greedy": [asdict(c) for c in self.greedy], "law": None if self.law is None else asdict(self.law)}


def greedy_identity(target: CausalLM, make_proposer: ProposerFactory, prompts: Sequence[tuple[str, list[int]]],
                    params: GenerationParams, *, verifier: ChainVerifier = verify_chain,
                    progress: Callable[[], None] = lambda: None) -> list[GreedyCase]:
    """Speculative against plain greedy decoding of each prompt (params' sampling is ignored: greedy)."""
    params = GenerationParams(max_new_tokens=params.max_new_tokens, gamma=params.gamma, eos_ids=params.eos_ids)
    cases = []
    for name, ids in prompts:
        max_len = len(ids) + params.max_new_tokens + params.gamma + 2
        plain = generate(target, ids, params).token_ids
        run = generate(target, ids, params, make_proposer(max_len, 1), verifier=verifier)
        case = _compare(target, name, ids, plain, run.token_ids)
        case.drafted, case.accepted, case.output = run.metrics.drafted, run.metrics.accepted, plain
        cases.append(case)
        progress()
    return cases


def _compare(target: CausalLM, name: str, prompt: list[int], plain: list[int], spec: list[int]) -> GreedyCase:
    n = min(len(plain), len(spec))
    at = next((i for i in range(n) if plain[i] != spec[i]), None if len(plain) == len(spec) else n)
    if at is None:
        return GreedyCase(name, len(plain), True)
    context = prompt + plain[:at]
    with torch.no_grad():
        cache = target.new_cache(len(context) + 1)
        logits = target.forward(torch.tensor([context]), cache, last_n=1)[0, -1].float()
    a = plain[at] if at < len(plain) else None
    b = spec[at] if at < len(spec) else None
    return GreedyCase(name, n, False, at, a, b, None if a is None else float(logits[a]),
                      None if b is None else float(logits[b]))


def law_prompt(target: CausalLM, prompts: Sequence[tuple[str, list[int]]], cases: Sequence[GreedyCase],
               sampling: SamplingParams) -> tuple[str, list[int]]:
    """Where the sampled-law check runs: on the prompt where speculation had the most accepted drafts per token of
    work (prompt + output), continued by its greedy output up to the position where the target is least sure
    under `sampling` (the law of the tokens after any prefix must match; right after a chat prompt they are often
    near-certain, "```python", and a check there sees nothing)."""
    def score(pair: tuple[tuple[str, list[int]], GreedyCase]) -> float:
        (_, ids), case = pair
        return case.accepted / (len(ids) + case.tokens)

    (name, ids), case = max(zip(prompts, cases), key=score)
    out = case.output
    if not out:
        return name, ids
    with torch.no_grad():
        cache = target.new_cache(len(ids) + len(out) + 1)
        logits = target.forward(torch.tensor([ids + out[:-1]]), cache, last_n=len(out))[0].float()
    p = logits_to_probs(logits, sampling)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)  # [len(out)]: of the token at each output position
    j = int(entropy.argmax())
    return (f"{name} + {j} tokens" if j else name), ids + out[:j]


def sample_arm(target: CausalLM, prompt: list[int], proposer: Proposer | None, sampling: SamplingParams, *,
               tokens: int, samples: int, gamma: int, seed: int, rows: int,
               verifier: ChainVerifier = verify_chain, progress: Callable[[], None] = lambda: None
               ) -> tuple[list[tuple[int, ...]], float | None]:
    """`samples` seeded runs of the first `tokens` tokens (seeds seed .. seed + samples - 1, no end-of-sequence
    stop), `rows` at a time in one batch; returns the token tuples and the arm's acceptance rate. Each run goes on
    `gamma` tokens past them: the first round is a plain step (the proposer starts after it), and the second then
    drafts a whole gamma inside the window."""
    length = tokens + gamma if proposer is not None else tokens
    batch = Batch(target, rows, len(prompt) + length, slack=gamma + 2, verifier=verifier)
    out: list[tuple[int, ...]] = []
    drafted = accepted = 0
    started = 0
    live: list = []
    while started < samples or batch.live:
        k = min(samples - started, rows - len(batch.live))  # the free rows, prefilled in one forward
        live += batch.add_many([NewSequence(prompt, GenerationParams(max_new_tokens=length, gamma=gamma,
                                                                     sampling=sampling, seed=seed + started + i),
                                            proposer) for i in range(k)])
        started += k
        batch.round()
        for seq in [s for s in live if s.result.finish_reason is not None]:
            live.remove(seq)
            if seq.result.error is not None:
                raise seq.result.error
            out.append(tuple(seq.result.token_ids[:tokens]))
            drafted += seq.metrics.drafted
            accepted += seq.metrics.accepted
            progress()
    return out, (accepted / drafted if drafted else None)


def two_sample_tv(a: list, b: list, *, permutations: int = 400, seed: int = 0) -> tuple[float, float, float]:
    """(TV between the empirical laws of a and b, its 95th percentile under the null that both come from one law,
    permutation p-value)."""
    import numpy as np

    codes = {x: i for i, x in enumerate(dict.fromkeys(list(a) + list(b)))}
    pooled = np.array([codes[x] for x in list(a) + list(b)])
    n, m, c = len(a), len(b), len(codes)

    def tv(labels: np.ndarray) -> float:
        return 0.5 * float(np.abs(np.bincount(labels[:n], minlength=c) / n - np.bincount(labels[n:], minlength=c) / m).sum())

    observed = tv(pooled)
    rng = np.random.default_rng(seed)
    null = np.sort([tv(rng.permutation(pooled)) for _ in range(permutations)])
    p = (1 + int((null >= observed - 1e-12).sum())) / (1 + permutations)
    return observed, float(null[int(0.95 * (permutations - 1))]), p


def law_check(target: CausalLM, make_proposer: ProposerFactory, name: str, prompt: list[int],
              sampling: SamplingParams, *, tokens: int, samples: int, gamma: int, seed: int = 0, rows: int = 8,
              verifier: ChainVerifier = verify_chain, level: float = 0.01, permutations: int = 2000,
              progress: Callable[[], None] = lambda: None) -> LawCheck:
    """The sampled-law check; fails where any test's p-value is below level / number of tests (Bonferroni; enough
    permutations that the smallest attainable p-value is well below that)."""
    common = dict(tokens=tokens, samples=samples, gamma=gamma, seed=seed, rows=rows, progress=progress)
    plain, _ = sample_arm(target, prompt, None, sampling, **common)
    spec, alpha = sample_arm(target, prompt, make_proposer(len(prompt) + tokens + gamma + 2, rows), sampling,
                             verifier=verifier, **common)
    n = max(permutations, int(4 * (tokens + 1) / level))
    tests = [LawTest(f"tokens 1-{tokens}", *two_sample_tv(plain, spec, permutations=n))]
    for i in range(tokens):
        tests.append(LawTest(f"token {i + 1}", *two_sample_tv([s[i] for s in plain], [s[i] for s in spec],
                                                              permutations=n, seed=i + 1)))
    check = LawCheck(name, samples, tokens, asdict(sampling), tests, alpha)
    check.passed = all(t.p_value >= level / len(tests) for t in tests)
    return check
