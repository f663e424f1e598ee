"""Verification: chain rejection sampling as pure tensor functions (no model, no cache, no I/O).

Vocabulary used throughout verispec:
  p      the target's processed distribution (temperature/top-k/top-p applied)
  q      the proposer's processed distribution over the same vocabulary
  gamma  number of tokens proposed in a round
  output tokens of a round = accepted drafts + one more token, which is either the *recovered* token
         (sampled from the residual at the first rejection) or the *bonus* token (sampled from the
         target's last distribution when all gamma drafts were accepted).
  mean accepted length = output tokens per target forward (it counts the recovered/bonus token).

Rule (Leviathan et al. 2023; Chen et al. 2023): accept draft x_i with probability min(1, p_i(x_i)/q_i(x_i));
at the first rejection i sample from normalize(max(0, p_i - q_i)); if none is rejected sample from p_gamma.
A deterministic proposer (n-gram) has one-hot q: it is accepted with probability p(x) and the residual is p
with x removed, which is exactly what the same formula gives.

Worked example, gamma = 3, drafts (a, b, c): the target forward sees [last, a, b, c] and returns
p_0 .. p_3 (p_i is the distribution of the token *after* input i). If a and b are accepted and c rejected,
num_accepted = 2 and tokens = (a, b, r, *) with r ~ normalize(max(0, p_2 - q_2)); the round emits 3 tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.sampling import SamplingParams, argmax, logits_to_probs


@dataclass(frozen=True)
class Verified:
    """Outcome of one round for each sequence of a batch.

    num_accepted: [B] drafts accepted, 0..gamma.
    tokens:       [B, gamma + 1]; row b emits tokens[b, : num_accepted[b] + 1] (entries after that are
                  meaningless).
    """

    num_accepted: Tensor
    tokens: Tensor


def verify_chain(draft: Tensor, p: Tensor, q: Tensor, generator: torch.Generator | None) -> Verified:
    """Stochastic chain verification.

    draft: [B, gamma] int64 proposed tokens; p: [B, gamma + 1, V] target probs; q: [B, gamma, V] proposal
    probs (rows may be one-hot for deterministic proposers). gamma may be 0 (plain sampling from p_0).
    Always draws B*gamma uniforms and B categorical samples, so the random stream does not depend on the
    outcome.
    """
    batch, gamma = draft.shape
    assert p.shape[:2] == (batch, gamma + 1) and q.shape[:2] == (batch, gamma), (draft.shape, p.shape, q.shape)
    rows = torch.arange(batch, device=p.device)
    idx = draft.unsqueeze(-1)
    p_x = p[:, :gamma].gather(-1, idx).squeeze(-1)  # [B, gamma]
    q_x = q.gather(-1, idx).squeeze(-1)  # [B, gamma]
    u = torch.rand(batch, gamma, generator=generator, device=p.device)
    # u < p/q without dividing: q(x) = 0 accepts whenever p(x) > 0, p(x) = 0 never accepts.
    accepted = u * q_x < p_x
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B] length of the accepted prefix
    # The extra token comes from normalize(max(0, p_n - q_n)); with q_gamma := 0 this is the bonus p_gamma.
    q_pad = torch.cat([q, q.new_zeros(batch, 1, q.shape[-1])], dim=1)  # [B, gamma + 1, V]
    p_n, q_n = p[rows, num_accepted], q_pad[rows, num_accepted]  # [B, V]
    residual = (p_n - q_n).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    # Mass 0 only by rounding (a rejection implies p(y) > q(y) somewhere); fall back to p itself.
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)
    extra = torch.multinomial(residual, 1, generator=generator).squeeze(-1)  # [B]
    tokens = torch.cat([draft, draft.new_zeros(batch, 1)], dim=1)
    tokens[rows, num_accepted] = extra
    return Verified(num_accepted=num_accepted, tokens=tokens)


def verify_greedy(draft: Tensor, target_argmax: Tensor) -> Verified:
    """Greedy chain verification: accept while draft == target argmax; the target's argmax at the first
    mismatch (or after the last draft) is the recovered/bonus token.

    draft: [B, gamma]; target_argmax: [B, gamma + 1] argmax of the target logits at each input position.
    """
    gamma = draft.shape[1]
    match = draft == target_argmax[:, :gamma]
    num_accepted = match.long().cumprod(-1).sum(-1)
    return Verified(num_accepted=num_accepted, tokens=target_argmax.clone())


ChainVerifier = Callable[[Tensor, Tensor, Tensor, "torch.Generator | None"], Verified]


def verify(drafts: list[Tensor], logits: list[Tensor], qs: list[Tensor | None], sampling: list[SamplingParams],
           generators: list[torch.Generator], chain: ChainVerifier = verify_chain) -> Verified:
    """Every row of a round in one call: the entry point the round uses.

    Row b proposed drafts[b] [g_b] (g_b may be 0) with proposal probs qs[b] [g_b, V] (None: a deterministic
    proposal, verified against one-hot q); logits[b] [g_b + 1, V] are the target's at [pending] + drafts[b].
    Greedy rows follow verify_greedy; the others are processed with their own SamplingParams and verified by
    `chain` (verify_chain; tests pass broken variants) drawing from their own generator, so a row's randomness
    never depends on the rows beside it. Returns num_accepted [B] and tokens [B, max g_b + 1] (row b emits
    tokens[b, : num_accepted[b] + 1]).
    """
    width = 1 + max((int(d.numel()) for d in drafts), default=0)
    num_accepted, tokens = [], []
    for draft, lg, q, params, generator in zip(drafts, logits, qs, sampling, generators):
        g = draft.numel()
        draft = draft.to(lg.device)
        if params.greedy:
            row = verify_greedy(draft[None], argmax(lg)[None])
        else:
            p = logits_to_probs(lg, params)  # [g + 1, V]
            if q is None:  # deterministic proposal: one-hot q (g = 0 gives an empty q)
                q = torch.zeros(g, p.shape[-1], device=p.device).scatter_(-1, draft[:, None], 1.0)
            row = chain(draft[None], p[None], q.to(p.device)[None], generator)
        num_accepted.append(row.num_accepted[0])
        tokens.append(torch.nn.functional.pad(row.tokens[0], (0, width - g - 1)))
    return Verified(num_accepted=torch.stack(num_accepted), tokens=torch.stack(tokens))
