"""EAGLE's feature-level drafter (Li et al. 2024): one decoder layer that predicts the target's next feature.

The target's feature h_t (its last block's output at position t, before the final norm) is what its LM head
reads to predict token t+1. The drafter reads the pair (h_t, token t+1):

    x_t  = fc([embed(token t+1), h_t])        (2H -> H)
    f_t+1 = decoder layer(x_<=t)                the predicted feature at position t+1, with a causal KV cache
    q    = softmax(head(norm(f_t+1)))          its guess at token t+2

and drafts on by feeding its own f as the next feature. EAGLE-3's multi-layer features (`feature_layers`, e.g.
(3, 14) of 28 blocks): the target also returns its outputs after those first blocks, and h_t above is one linear
map of all of them, g_t = fuse([low_t, mid_t, h_t]) ((k+1)H -> H), computed once per true pair; drafting steps still
feed the drafter's own f in its place. The low and mid layers still carry what the last has already discarded
about the tokens themselves. Embedding and final norm are the target's (shared, not
copied); the head is `head_vocab` rows of the target's LM head, so a draft step reads one layer and a small head:
about a twentieth of the target. Which rows (`head_order`): the first ids ("first"; byte-level BPE ids run roughly
in frequency order), or the ids most frequent in the drafter's own training tokens ("frequent", EAGLE-3's draft
vocabulary; their ids, `head_ids`, are stored with the weights): on the suite's code answers the 16,384 ids most
frequent in the standard library's source cover 94.0% of the target's tokens, as the first 32,000 ids do
(benchmarks/results/2026-12-02-zen3-avx2-eagle-head-ids): half the rows propose as much code (prose: 77% against 93%).

`EagleDrafter` is a one-layer `LlamaModel` whose `inputs` reads features, so caches, tree masks, batched rows and
the w4a8 kernel are the target's own code. A drafter directory holds config.json (`EagleConfig`) and
model.safetensors (fc, the layer, the head rows, and a "frequent" head's ids).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from verispec.models.files import DRAFTER_CONFIG, DRAFTER_WEIGHTS
from verispec.models.llama import LlamaConfig, LlamaModel, last_block


HEAD_ORDERS = ("first", "frequent")


@dataclass(frozen=True)
class EagleConfig:
    kind: str  # "eagle"
    target: str  # the target it was trained for (its name), for the record; load checks the hidden size
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_vocab: int  # rows of the target's LM head the drafter proposes from
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    attention_bias: bool
    feature_layers: tuple[int, ...] = ()  # EAGLE-3: the target's outputs after these first blocks, fused (see above)
    head_order: str = "first"  # which LM-head rows: "first" (ids 0..head_vocab-1) or "frequent" (head_ids stored)

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(k) for k in self.feature_layers))
        if self.head_order not in HEAD_ORDERS:
            raise ValueError(f"head_order must be one of {', '.join(HEAD_ORDERS)}, got {self.head_order!r}")

    @property
    def feature_width(self) -> int:
        """The width of the target's features this drafter reads: its feature layers' outputs, then the last's."""
        return (len(self.feature_layers) + 1) * self.hidden_size

    def check_layers(self, num_hidden_layers: int) -> None:
        """Raise unless feature_layers are increasing block counts strictly inside the target's."""
        k = self.feature_layers
        if any(not 0 < a < num_hidden_layers for a in k) or list(k) != sorted(set(k)):
            raise ValueError(f"feature layers must be increasing block counts in 1..{num_hidden_layers - 1}, got "
                             f"{','.join(map(str, k))}")

    def llama(self, vocab_size: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=1,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
                           max_position_embeddings=self.max_position_embeddings, attention_bias=self.attention_bias)

    @classmethod
    def for_target(cls, target: LlamaModel, name: str, *, intermediate_size: int | None = None,
                   head_vocab: int = 32000, feature_layers: tuple[int, ...] = (),
                   head_order: str = "first") -> "EagleConfig":
        c = target.cfg
        cfg = cls("eagle", name, c.hidden_size, intermediate_size or c.intermediate_size, c.num_attention_heads,
                  c.num_key_value_heads, min(head_vocab, c.vocab_size), c.rms_norm_eps, c.rope_theta,
                  c.max_position_embeddings, c.attention_bias, feature_layers, head_order)
        cfg.check_layers(c.num_hidden_layers)
        return cfg


def narrowed_mlp(block: Mapping[str, Tensor], width: int) -> dict[str, Tensor]:
    """A block's weights with its MLP cut to `width` channels: those of largest |gate row| |up row| |down column|
    (a channel's reach on the output, as a whole block's weights see it), kept in their order. Why: a drafter
    narrower than the target can still start from the target's own last block rather than from noise."""
    out = dict(block)
    w13, w2 = block["w13.weight"], block["w2.weight"]
    full = w2.shape[1]
    if width == full:
        return out
    if width > full:
        raise ValueError(f"the drafter's MLP ({width} channels) is wider than the target block's ({full})")
    gate, up = w13[:full].float(), w13[full:].float()
    score = gate.norm(dim=1) * up.norm(dim=1) * w2.float().norm(dim=0)
    keep = torch.topk(score, width).indices.sort().values
    out["w13.weight"] = torch.cat([w13[:full][keep], w13[full:][keep]])
    out["w2.weight"] = w2[:, keep]
    return out


class EagleDrafter(LlamaModel):
    """One decoder layer over [token embedding, target feature] (see the module docstring)."""

    def __init__(self, cfg: EagleConfig, vocab_size: int) -> None:
        super().__init__(cfg.llama(vocab_size))
        h = cfg.hidden_size
        self.eagle = cfg
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.fuse = nn.Linear(cfg.feature_width, h, bias=False) if cfg.feature_layers else None
        self.lm_head = nn.Linear(h, cfg.head_vocab, bias=False)
        self.head_ids: Tensor | None  # the target id of each head row; None: row i is id i
        if cfg.head_order == "frequent":
            self.register_buffer("head_ids", torch.zeros(cfg.head_vocab, dtype=torch.long))
        else:
            self.head_ids = None

    @property
    def head_id_list(self) -> Tensor:
        """The target id of each head row, [head_vocab] (0..head_vocab-1 for a "first" head)."""
        if self.head_ids is not None:
            return self.head_ids
        return torch.arange(self.eagle.head_vocab, device=self.lm_head.weight.device)

    @classmethod
    def fresh(cls, cfg: EagleConfig, target: LlamaModel, head: Tensor, *, seed: int = 0,
              head_ids: Tensor | None = None, block: Mapping[str, Tensor] | None = None) -> "EagleDrafter":
        """A drafter to train, on the target's device: fc passes the feature through (x = h_t), the head is `head`
        [head_vocab, H] (the target's LM head rows, float), the rows of ids `head_ids` for a "frequent" head. The
        layer starts as `block`, the target's last block's float weights by their names in a block (`target_block`):
        its attention whole and the `intermediate_size` MLP channels of largest |gate| |up| |down| where the drafter's
        MLP is narrower; without it, as small random weights with its output projections zero (an identity)."""
        if (head_ids is not None) != (cfg.head_order == "frequent"):
            need = "takes no" if head_ids is not None else "needs its"
            raise ValueError(f"a {cfg.head_order!r} head {need} head ids")
        gen = torch.Generator().manual_seed(seed)
        with torch.device("meta"):
            drafter = cls(cfg, target.vocab_size)
        h = cfg.hidden_size
        state: dict[str, Tensor] = {"fc.weight": torch.cat([torch.zeros(h, h), torch.eye(h)], dim=1),
                                    "fc.bias": torch.zeros(h), "lm_head.weight": head.detach().float().clone()}
        if head_ids is not None:
            state["head_ids"] = head_ids.long().clone()
        if drafter.fuse is not None:  # starts as the last block's output alone (EAGLE-1's feature)
            state["fuse.weight"] = torch.cat([torch.zeros(h, len(cfg.feature_layers) * h), torch.eye(h)], dim=1)
        if block is not None:
            block = narrowed_mlp(block, cfg.intermediate_size)
        for name, p in drafter.layers[0].named_parameters():
            if block is not None:
                if block[name].shape != p.shape:
                    raise ValueError(f"the target's block has {name} of shape {tuple(block[name].shape)}, the "
                                     f"drafter's is {tuple(p.shape)}")
                state[f"layers.0.{name}"] = block[name].detach().float().clone()
            elif name.endswith("norm.weight"):
                state[f"layers.0.{name}"] = torch.ones(p.shape)
            elif name in ("wo.weight", "w2.weight"):
                state[f"layers.0.{name}"] = torch.zeros(p.shape)
            else:
                state[f"layers.0.{name}"] = 0.02 * torch.randn(p.shape, generator=gen)
        drafter.load_state_dict(state, strict=False, assign=True)
        drafter.share(target).init_rope()
        return drafter.to(target.device)  # beside the target (a GPU's); its own weights stay float32

    def inputs(self, tokens: Tensor, features: Tensor | None) -> Tensor:
        if features is None:
            raise ValueError("the EAGLE drafter reads the target's features beside each token")
        if isinstance(self.fc, TokenTableFc):  # inference on the kernel: fc split (TokenTableFc)
            return self.fc(tokens, features.to(self.dtype), self.embed_tokens)
        return self.fc(torch.cat([self.embed_tokens(tokens), features.to(self.dtype)], dim=-1))

    def fuse_features(self, hidden: Tensor) -> Tensor:
        """The target's features [..., F] (`LlamaModel.forward(hidden=True)`) as the drafter reads them, [..., H]:
        as they are, or with EAGLE-3's feature layers the one linear map of all of them (once per true pair)."""
        if self.fuse is None:  # the last block's output, whatever feature layers the target returns before it
            return last_block(hidden, self.eagle.hidden_size)
        return self.fuse(hidden.to(self.dtype))

    def share(self, target: LlamaModel) -> "EagleDrafter":
        """Use the target's embedding table and final norm (never trained here, never copied), and have its
        forwards return the feature layers this drafter reads (one set a target: the last block's output, always
        the last H columns, serves every other feature reader)."""
        if target.cfg.hidden_size != self.eagle.hidden_size:
            raise ValueError(f"drafter for hidden size {self.eagle.hidden_size}, target has {target.cfg.hidden_size}")
        self.eagle.check_layers(target.cfg.num_hidden_layers)
        if self.eagle.feature_layers:
            if target.feature_layers and target.feature_layers != self.eagle.feature_layers:
                raise ValueError(f"the target already returns the outputs of its first {target.feature_layers} blocks "
                                 f"for another drafter; this one reads {self.eagle.feature_layers}")
            target.feature_layers = self.eagle.feature_layers
        self.embed, self.norm = target.embed, target.norm
        return self

    def train_forward(self, tokens: Tensor, features: Tensor) -> Tensor:
        """Predicted features [B, T, H] for pairs (features[:, t], tokens[:, t]) from position 0, causal, with
        autograd (no cache): teacher forcing, step 1 of `train_unrolled`."""
        return self._chains(tokens, features, 1)[0]

    def train_unrolled(self, tokens: Tensor, features: Tensor, depth: int) -> list[Tensor]:
        """Predicted features of draft steps 1..depth for every anchor t, with autograd: EAGLE-3's training-time
        test. tokens [B, L] and features [B, L, H] are a sequence and the target's features over it.

        Step 1 reads the true pairs (h_t, x_t+1) (`train_forward`). Step n reads the drafter's own prediction of
        step n-1 beside the true token x_t+n, at position t+n-1, and attends what it would see drafting from t:
        the true pairs' keys at positions <= t and its own earlier steps' keys from anchor t. Returns depth
        tensors, the n-th [B, L-n, H] predicting features[:, n:]. Teacher forcing alone (depth 1) fits step 1;
        later steps then read features unlike any it was fitted on, which is where a chain's acceptance drops."""
        return self._chains(tokens[:, 1:], features[:, :-1], depth)

    def _chains(self, tokens: Tensor, features: Tensor, depth: int) -> list[Tensor]:
        """train_unrolled over the pairs (features[:, t], tokens[:, t]): step n's t-th row is the chain from pair t."""
        keys: list[tuple[Tensor, Tensor]] = []

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            keys.append((k, v))
            if len(keys) == 1:  # step 1: the true pairs, causal
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
            n = q.shape[2]  # anchors this step has
            rep = q.shape[1] // k.shape[1]
            k1, v1 = (t[:, :, :n].repeat_interleave(rep, 1) for t in keys[0])
            scale = q.shape[-1] ** -0.5
            scores = [(q @ k1.transpose(-1, -2) * scale).masked_fill(
                torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))]
            later = [(kj[:, :, :n].repeat_interleave(rep, 1), vj[:, :, :n].repeat_interleave(rep, 1))
                     for kj, vj in keys[1:]]
            scores += [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in later]
            p = torch.cat(scores, -1).softmax(-1)
            out = p[..., :n] @ v1
            for j, (_, vj) in enumerate(later):
                out = out + p[..., n + j : n + j + 1] * vj
            return out

        preds: list[Tensor] = []
        feats = self.fuse_features(features)
        for step in range(1, depth + 1):
            toks = tokens[:, step - 1 :]
            x = self.inputs(toks, feats[:, : toks.shape[1]])
            t = x.shape[1]
            cos, sin = self.cos[step - 1 : step - 1 + t].to(x.dtype), self.sin[step - 1 : step - 1 + t].to(x.dtype)
            pred = self.layers[0](x, 0, None, cos, sin, attend)
            preds.append(pred)
            feats = pred[:, :-1]
        return preds

    def own_state(self) -> dict[str, Tensor]:
        """The drafter's own weights (fc, layer, head): what a drafter directory stores."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith(("embed.", "norm."))}

    def save(self, directory: Path) -> None:
        from verispec.models.files import save_drafter

        save_drafter(directory, self.own_state(), asdict(self.eagle))


def _float_linear(weight: Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    return linear


def load_drafter(directory: str | Path, target: LlamaModel, *, quantize_kind: str | None = None,
                 dtype: torch.dtype | None = None) -> EagleDrafter:
    """A drafter directory over `target` (its embedding and norm shared), on the target's device. quantize_kind:
    e.g. "w4a8-4bit" to run the layer and head on the target's kernel (the drafter never changes the output, only
    acceptance). dtype: its own weights' (default: the target's activation dtype, in which its pairs come;
    training keeps float32 weights)."""
    from verispec.models.errors import ModelError
    from verispec.models.files import drafter_config, read_safetensors

    directory = Path(directory).expanduser()
    try:
        cfg = EagleConfig(**drafter_config(directory, "eagle", "an EAGLE drafter"))
    except (TypeError, ValueError) as e:
        raise ModelError(f"{directory} is not an EAGLE drafter directory ({DRAFTER_CONFIG}: {e})") from None
    with torch.device("meta"):  # the embedding and norm come from the target: never allocate them here
        drafter = EagleDrafter(cfg, target.vocab_size)
    try:
        state = read_safetensors(directory / DRAFTER_WEIGHTS)
        missing = drafter.load_state_dict(state, strict=False, assign=True).missing_keys
    except (OSError, RuntimeError) as e:
        raise ModelError(f"{directory / DRAFTER_WEIGHTS} does not fit this drafter: {e}") from None
    if [k for k in missing if not k.startswith(("embed.", "norm."))]:
        raise ModelError(f"{directory / DRAFTER_WEIGHTS} lacks {missing[:3]}")
    # the target's activation dtype (float32 beside a w4a8 target, bf16 beside a bf16 one): the pair it reads
    # comes in that dtype, and the drafter only changes acceptance, never the output
    drafter = drafter.to(dtype=dtype or target.dtype).eval()
    drafter.requires_grad_(False)
    drafter.share(target).init_rope()
    if quantize_kind is not None:
        from verispec.models.kernels import cpu_flags
        from verispec.models.quant import quantize

        # the layer and the head; fc's feature half and fuse read the target's features, whose outlier dimensions
        # (~90 against an RMS of ~7 in Qwen2.5-Coder-1.5B) would coarsen everything else under per-token int8
        # rounding: on the w4a8 kernel they take each row as two (TwoRowInt8Linear), else floating point (bf16
        # weights where the CPU has bf16)
        quantize(drafter.layers, quantize_kind)
        drafter.lm_head = quantize(nn.ModuleList([drafter.lm_head]), quantize_kind)[0]
        bf16 = target.device.type == "cpu" and "avx512_bf16" in cpu_flags()
        kernel = quantize_kind.startswith("w4a8")
        drafter.fc = TokenTableFc(drafter.fc, drafter, drafter.head_id_list, bf16=bf16, kernel=kernel)
        if drafter.fuse is not None and (kernel or bf16):
            drafter.fuse = TwoRowInt8Linear(drafter.fuse) if kernel else Bf16Linear(drafter.fuse)
    return drafter.to(target.device)  # its own weights and rope tables beside the target's (a GPU's)


class Bf16Linear(nn.Module):
    """A float32 linear layer's weights stored in bfloat16, its input rounded to bfloat16 and its output returned
    as float32: half the bytes. The EAGLE drafter's fc read ~19 MB a draft token in float32, ~40% of a draft
    forward beside the target's (its weights evicted between draft steps); in bf16, on a CPU with native bf16,
    c fell 0.098 -> 0.074 and EAGLE's decoding rose 4.4% (4.1% in a first run) at the same accepted length, 10
    code, maths and QA prompts, greedy, AMD EPYC (benchmarks/results/2026-11-27-epyc-avx512-eagle-fc-bf16). Where
    bf16 is emulated (AVX2 CPUs) the float32 layer stays."""

    def __init__(self, fc: nn.Linear) -> None:
        super().__init__()
        from verispec.models.llama import Linear

        with torch.device("meta"):
            self.inner = Linear(fc.in_features, fc.out_features, bias=fc.bias is not None, dtype=torch.bfloat16)
        self.inner.weight = nn.Parameter(fc.weight.detach().to(torch.bfloat16), requires_grad=False)
        if fc.bias is not None:
            self.inner.bias = nn.Parameter(fc.bias.detach().to(torch.bfloat16), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x.to(torch.bfloat16)).to(x.dtype)


class TwoRowInt8Linear(nn.Module):
    """A float linear layer on the w4a8 kernel: 8-bit weights, and each input row sent as two int8 rows, its own
    per-row codes and the residual they leave, whose outputs are summed. The target's features have outlier
    dimensions (~90 against an RMS of ~6.4 in Qwen2.5-Coder-1.5B, 1484 at the first position) that per-row int8
    codes alone cannot hold (3.4-5.0% off); with the residual as a second row the activations carry ~15 bits and the
    output is 0.7% off float32's (bf16 weights: 0.25%), the 8-bit weight grid's error. Two rows of a one-token
    forward cost what one does where reading the weights bounds it, and the weights are half bf16's bytes, read with
    the kernel's prefetch: the EAGLE drafter's feature half took 0.22 against 0.58 ms from cold caches, and a
    drafter forward inside real rounds 0.89x the time (AMD EPYC Zen 5;
    benchmarks/results/2026-12-02-zen5-avx512-eagle-two-rows). The drafter only changes acceptance, never the
    output."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        from verispec.models.quant import W4A8Linear

        self.inner = W4A8Linear(linear, bits=8)

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x, split=True).to(x.dtype)  # the residual rows made and summed in the kernel


class TokenTableFc(nn.Module):
    """fc split in two at inference: [embed(x), h] W^T + b = T[x] + h W_h^T, where T = embed(ids) W_e^T + b over the
    ids the head proposes is computed once (W = [W_e | W_h]). A draft step then reads W_h, half of fc, and one row of
    T: every token it drafts is one of those ids; other ids (the target's, in a round's first forward) take W_e. The
    table holds rows x H bf16 values (98 MB for the 1.5B target's 32,000-row head), built in 0.4 s with bf16
    weights and 1.3 s in float32 on 2 cores. Where the CPU has native bf16 both halves' weights are bf16 (as
    Bf16Linear), else float32; beside a w4a8 target the feature half runs on the kernel (TwoRowInt8Linear).

    The drafter only changes acceptance, never the output: T[x] is the same sum as fc's, rounded once to bf16 (fc's
    own output is bf16 on such a CPU). Whole, fc read 9.4 MB a draft step, a fifth of the drafter's bytes; split,
    a drafter forward inside real rounds took 0.94x the time (c 0.070 -> 0.068, 6 code prompts, greedy, the same
    outputs) and 0.76x in a row of forwards (AMD EPYC Zen 5; benchmarks/results/2026-12-02-zen5-avx512-eagle-fc-table).
    """

    def __init__(self, fc: nn.Linear, drafter: "EagleDrafter", ids: Tensor, *, bf16: bool,
                 kernel: bool = False) -> None:
        """ids: the target ids the table holds (the head's); bf16: both halves' weights in bf16 (else float32);
        kernel: the feature half, the one a draft step reads, on the w4a8 kernel instead (TwoRowInt8Linear)."""
        super().__init__()
        h = fc.out_features
        w = fc.weight.detach().float()
        b = fc.bias.detach().float() if fc.bias is not None else torch.zeros(h)
        token, feature = _float_linear(w[:, :h]), _float_linear(w[:, h:])
        self.token_part: nn.Module = Bf16Linear(token) if bf16 else token
        self.feature_part: nn.Module = (TwoRowInt8Linear(feature) if kernel else Bf16Linear(feature) if bf16
                                        else feature)
        self.register_buffer("bias", b, persistent=False)
        ids = ids.to(fc.weight.device)
        slot = torch.full((drafter.vocab_size,), -1, dtype=torch.long, device=ids.device)
        self.register_buffer("slot", slot.index_copy_(0, ids, torch.arange(len(ids), device=ids.device)),
                             persistent=False)  # a target id's row of the table, or -1
        with torch.no_grad():
            table = torch.cat([self.token_part(drafter.embed_tokens(chunk[None]).float())[0] + b
                               for chunk in ids.split(4096)])
        self.register_buffer("table", table.to(torch.bfloat16), persistent=False)

    def forward(self, tokens: Tensor, features: Tensor, embed_tokens: Callable[[Tensor], Tensor]) -> Tensor:
        """tokens [B, T], features [B, T, H] -> fc's output [B, T, H] in the features' dtype (embed_tokens: the
        drafter's, for ids past the table)."""
        out = self.feature_part(features)
        slot = self.slot[tokens]
        inside = slot >= 0
        part = self.table[slot.clamp_min(0)].to(out.dtype)
        if not bool(inside.all()):  # ids past the table: their embeddings through W_e
            other = self.token_part(embed_tokens(tokens[~inside][None]).to(out.dtype))[0] + self.bias
            part[~inside] = other.to(out.dtype)
        return out + part
