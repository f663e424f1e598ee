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

Trees (SpecInfer's multi-step speculative sampling; recursive rejection sampling): a proposal may be a tree of
nodes, node i with token x_i, parent parents[i] (-1: the pending token) and q_i, the distribution x_i was drawn
from given its parent *and its earlier siblings* (the same q for children drawn i.i.d.; q with the earlier
siblings removed and renormalised for children drawn without replacement; one-hot for a deterministic child).
From the root, the children of the current node are tried in order: child x is accepted with probability
min(1, p(x) / q(x)); on rejection p <- normalize(max(0, p - q)) and the next sibling is tried. Accepting moves
to that child and its p; when every child is rejected (or there is none) one token is drawn from the current p.
Each step emits a token distributed exactly as the target's p at that node, whatever the tree's shape, as long
as the shape does not depend on the draws being verified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.sampling import NO_LAW, SamplingParams, argmax, compiled_for, draw_block, logits_to_probs, sample


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
    # The extra token comes from normalize(max(0, p_n - q_n)), q_gamma := 0: the bonus is drawn from p_gamma itself.
    # (sample draws in proportion to its weights: the residual needs no normalizing.)
    p_n = p[rows, num_accepted]  # [B, V]
    if gamma:
        rejected = (num_accepted < gamma)[:, None]
        q_n = torch.where(rejected, q[rows, num_accepted.clamp_max(gamma - 1)], 0.0)
        residual = (p_n - q_n).clamp_min_(0.0)
        # Mass 0 only by rounding (a rejection implies p(y) > q(y) somewhere); fall back to p itself.
        p_n = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_n)
    extra = sample(p_n, generator)  # [B]
    tokens = torch.cat([draft, draft.new_zeros(batch, 1)], dim=1)
    tokens[rows, num_accepted] = extra
    return Verified(num_accepted=num_accepted, tokens=tokens)


def verify_chain_compiled(draft: Tensor, logits: Tensor, q: Tensor | None, params: SamplingParams,
                          generator: torch.Generator | None) -> Verified | None:
    """verify_chain for one row from the target's logits [g + 1, V] (draft [g], q [g, V] or None: one-hot), in one
    compiled call on a CPU (sample.cpp's verify_row): the same uniforms drawn in the same order, the same
    probabilities bit for bit, so the same outcome. It takes each position's normalizer without writing its
    probabilities and builds only the drawn position's law, where the torch code softmaxes every position and
    then indexes them (~1.3 ms of a 45-70 ms round on a 2-core AMD EPYC). None where it does not apply: top-k or
    top-p, not a CPU tensor, no compiled kernel."""
    if logits.device.type == "cpu":
        logits = logits.float()  # as logits_to_probs takes them (a bfloat16 target's)
    kernel = compiled_for(logits)
    if kernel is None or 0 < params.top_k < logits.shape[-1] or params.top_p < 1.0 or params.greedy:
        return None
    if q is not None and (q.dtype != torch.float32 or q.device.type != "cpu"):
        return None
    g, vocab = draft.numel(), logits.shape[-1]
    u = torch.rand(1, g, generator=generator)  # verify_chain's acceptance uniforms, then sample's one draw
    u_last = torch.rand(1, dtype=torch.float64, generator=generator)
    empty = torch.empty(0, dtype=torch.float32)
    n, token = kernel.verify_row(logits.contiguous(), params.temperature, draft.contiguous(),
                                 empty if q is None else q.contiguous(), u[0], u_last,
                                 draw_block(vocab) or vocab).tolist()
    if token < 0:
        raise ValueError(NO_LAW)
    tokens = torch.cat([draft, draft.new_zeros(1)])
    tokens[n] = token
    return Verified(num_accepted=torch.tensor([n]), tokens=tokens[None])


def verify_greedy(draft: Tensor, target_argmax: Tensor) -> Verified:
    """Greedy chain verification: accept while draft == target argmax; the target's argmax at the first
    mismatch (or after the last draft) is the recovered/bonus token.

    draft: [B, gamma]; target_argmax: [B, gamma + 1] argmax of the target logits at each input position.
    """
    gamma = draft.shape[1]
    match = draft == target_argmax[:, :gamma]
    num_accepted = match.long().cumprod(-1).sum(-1)
    return Verified(num_accepted=num_accepted, tokens=target_argmax.clone())


def children_of(parents: list[int]) -> dict[int, list[int]]:
    """Node -> its children in order (-1: the root's); parents[i] < i."""
    out: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise ValueError(f"node {i} has parent {parent}: a parent must come before its children")
        out.setdefault(parent, []).append(i)
    return out


def verify_tree(tokens: list[int], parents: list[int], p: Tensor, q: Tensor | None,
                generator: torch.Generator | None) -> tuple[list[int], int]:
    """Stochastic tree verification for one sequence (rule in the module docstring).

    tokens, parents: the N nodes (parents[i] < i; -1 is the pending token); p [N + 1, V]: the target's probs after
    the pending token (row 0) and after node i (row i + 1); q [N, V] (None: every node deterministic, one-hot q).
    Returns (path, token): the accepted nodes, root first, and the recovered/bonus token drawn at the last one.

    Worked example: children a, b of the root (i.i.d. from q), c below a. If a is rejected, b is tried against
    r = normalize(max(0, p_0 - q_a)); if b is accepted, b has no children, so the token is drawn from p_2 (after b):
    path [1], token ~ p[2].
    """
    kids = children_of(parents)
    node, path = -1, []
    cur = p[0]
    while True:
        for child in kids.get(node, []):
            x = tokens[child]
            qx = q[child, x] if q is not None else 1.0  # a deterministic child has one-hot q
            u = torch.rand((), generator=generator, device=cur.device)
            if u * qx < cur[x]:  # accept with probability min(1, p(x) / q(x))
                path.append(child)
                node, cur = child, p[child + 1]
                break
            if q is not None:
                residual = (cur - q[child]).clamp_min(0.0)
            else:
                residual = cur.clone()
                residual[x] = 0.0
            mass = residual.sum()
            # mass 0 only by rounding (a rejection implies p > q somewhere): keep p as it was
            cur = residual / mass if mass > 0 else cur
        else:
            return path, int(sample(cur, generator))


def verify_tree_greedy(tokens: list[int], parents: list[int], target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy tree verification: from the root, follow the child whose token is the target's argmax at the current
    node; stop where none is. target_argmax [N + 1] as p's rows in verify_tree. Returns (path, token)."""
    kids = children_of(parents)
    node, path = -1, []
    while True:
        want = target_argmax[node + 1]
        nxt = next((c for c in kids.get(node, []) if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


ChainVerifier = Callable[[Tensor, Tensor, Tensor, "torch.Generator | None"], Verified]
TreeVerifier = Callable[[list[int], list[int], Tensor, "Tensor | None", "torch.Generator | None"], tuple[list[int], int]]


@dataclass(frozen=True)
class RowVerified:
    """One row's round: `path` the accepted proposal indices in order (0 .. n-1 for a chain), `emitted` their tokens
    and then the recovered/bonus token."""

    path: list[int]
    emitted: list[int]

    @property
    def num_accepted(self) -> int:
        return len(self.path)


def verify(drafts: list[Tensor], logits: list[Tensor], qs: list[Tensor | None], sampling: list[SamplingParams],
           generators: list[torch.Generator], chain: ChainVerifier = verify_chain, *,
           parents: list[Tensor | None] | None = None, tree: TreeVerifier = verify_tree) -> list[RowVerified]:
    """Every row of a round in one call: the entry point the round uses.

    Row b proposed drafts[b] [g_b] (g_b may be 0) with proposal probs qs[b] [g_b, V] (None: a deterministic
    proposal, verified against one-hot q); logits[b] [g_b + 1, V] are the target's at [pending] + drafts[b].
    parents[b], where given, makes row b's drafts a tree (verify_tree's parents); otherwise they are a chain.
    Greedy rows follow verify_greedy / verify_tree_greedy; the others are processed with their own SamplingParams
    and verified by `chain` / `tree` (tests pass broken variants) drawing from their own generator, so a row's
    randomness never depends on the rows beside it.
    """
    out = []
    for b, (draft, lg, q, params, generator) in enumerate(zip(drafts, logits, qs, sampling, generators)):
        g = draft.numel()
        draft = draft.to(lg.device)
        par = parents[b] if parents is not None else None
        if par is not None:
            toks, par_list = draft.tolist(), par.tolist()
            if params.greedy:
                path, extra = verify_tree_greedy(toks, par_list, argmax(lg).tolist())
            else:
                path, extra = tree(toks, par_list, logits_to_probs(lg, params),
                                   None if q is None else q.to(lg.device), generator)
            out.append(RowVerified(path, [toks[i] for i in path] + [extra]))
            continue
        if params.greedy:
            row = verify_greedy(draft[None], argmax(lg)[None])
        else:
            # the default rule from the logits in one compiled call where it can (the same draws); a test's
            # broken `chain` always runs as given
            row = verify_chain_compiled(draft, lg, q, params, generator) if chain is verify_chain else None
            if row is None:
                p = logits_to_probs(lg, params)  # [g + 1, V]
                if q is None:  # deterministic proposal: one-hot q (g = 0 gives an empty q)
                    q = torch.zeros(g, p.shape[-1], device=p.device).scatter_(-1, draft[:, None], 1.0)
                row = chain(draft[None], p[None], q.to(p.device)[None], generator)
        n = int(row.num_accepted[0])
        out.append(RowVerified(list(range(n)), row.tokens[0, : n + 1].tolist()))
    return out
