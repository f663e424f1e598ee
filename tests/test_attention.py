"""verispec's CPU attention kernel (kernels/attention.cpp): right, and each query computed on its own.

Exact greedy speculation needs a verified token to get the bits a decoding step gives it, so a query's result
must not depend on the queries, rows or masked keys beside it: checked bit for bit here, in both builds (AVX-512
and AVX2, which must also agree with each other), against torch's attention for the values.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from verispec.models import kernels
from verispec.models.kernels import ATTENTION_ENV, KernelError

NO_MASK = torch.empty(0, dtype=torch.bool)


def _builds() -> list:
    try:
        return [kernels.w4a8(isa) for isa in kernels.available_isas()]
    except KernelError as e:  # no compiler here: the models use torch's attention
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def builds() -> list:
    found = _builds()
    if not found:
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2: the models use torch's attention")
    return found


# (batch, heads, kv heads, queries, keys, head dim): the real pair's shapes, and odd head sizes (zero-padded)
SHAPES = [(1, 12, 2, 1, 300, 128), (2, 14, 2, 5, 77, 64), (1, 4, 4, 3, 7, 16), (3, 6, 2, 4, 33, 24), (1, 4, 2, 2, 9, 8)]


def _qkv(b: int, h: int, kv: int, t: int, s: int, d: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, n, m, d, generator=gen) for n, m in ((h, t), (kv, s), (kv, s)))


@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matches_torch_attention(builds, shape):
    b, h, kv, t, s, d = shape
    q, k, v = _qkv(*shape)
    causal = torch.ones(t, s, dtype=torch.bool).tril(s - t)
    tree = causal.clone()
    tree[-1, s - t] = False  # the last query skips the first new token: a branch of a tree
    for mask in (causal, tree):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        for mod in builds:
            got = mod.attention(q, k, v, mask.expand(b, t, s).contiguous(), d**-0.5)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for mod in builds:  # an empty mask means causal
        assert torch.equal(mod.attention(q, k, v, NO_MASK, d**-0.5),
                           mod.attention(q, k, v, causal.expand(b, t, s).contiguous(), d**-0.5))


@pytest.mark.parametrize("shape", SHAPES)
def test_each_query_gets_the_bits_it_gets_alone(builds, shape):
    """Query t of row r over the keys it sees, attended in one call with every other query and row, equals the
    same query attended alone (as a decoding step) over exactly those keys, through a strided cache view."""
    b, h, kv, t, s, d = shape
    q, k, v = _qkv(*shape, seed=1)
    cache_k, cache_v = torch.zeros(b, kv, s + 20, d), torch.zeros(b, kv, s + 20, d)  # slots past S: scratch
    cache_k[:, :, :s], cache_v[:, :, :s] = k, v
    for mod in builds:
        together = mod.attention(q, cache_k[:, :, :s], cache_v[:, :, :s], NO_MASK, d**-0.5)
        for r in range(b):
            for i in range(t):
                n = s - t + i + 1
                alone = mod.attention(q[r : r + 1, :, i : i + 1], cache_k[r : r + 1, :, :n],
                                      cache_v[r : r + 1, :, :n], NO_MASK, d**-0.5)
                assert torch.equal(alone[0, :, 0], together[r, :, i]), (r, i)


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_a_tree_node_gets_the_bits_of_its_keys_side_by_side(builds, shape):
    """A token-tree node sees the prefix and its ancestors, with its siblings' slots between them unseen: it must
    get the bits that a decoding step over the same keys, packed next to each other, gives (exact greedy trees).
    Unseen keys shift later ones to other vector lanes, which changed the softmax's sum before keys were packed."""
    b, h, kv, t, s, d = shape
    q, k, v = _qkv(b, h, kv, 1, s + 40, d, seed=5)
    gen = torch.Generator().manual_seed(6)
    for gaps in (1, 3, 17):
        seen = torch.ones(s + 40, dtype=torch.bool)
        seen[torch.randperm(s + 40, generator=gen)[:gaps]] = False
        seen[-1] = True
        idx = seen.nonzero().squeeze(-1)
        for mod in builds:
            tree = mod.attention(q, k, v, seen.expand(b, 1, s + 40).contiguous(), d**-0.5)
            packed = mod.attention(q, k[:, :, idx].contiguous(), v[:, :, idx].contiguous(), NO_MASK, d**-0.5)
            assert torch.equal(tree, packed), gaps


def test_builds_agree_bit_for_bit(builds):
    if len(builds) < 2:
        pytest.skip("one kernel build runs on this CPU")
    q, k, v = _qkv(2, 14, 2, 5, 130, 64, seed=2)
    mask = torch.rand(2, 5, 130, generator=torch.Generator().manual_seed(3)) < 0.7
    outs = [mod.attention(q, k, v, mask, 0.125) for mod in builds]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("scale", [1.0, 300.0])  # 300: gates past e^x's clamps at -87 and 88
def test_layer_builds_agree_bit_for_bit(builds, tiny_target, scale):
    """layer.cpp's norms, rope and SiLU (vec.h's 16-float vectors: one AVX-512 register, or a pair of AVX2 ones)
    give the same bits in both builds, tails included (the tiny model's widths are not multiples of 16)."""
    import copy

    from verispec.models.quant import quantize

    if len(builds) < 2:
        pytest.skip("one kernel build runs on this CPU")
    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    block, t = model.layers[0], 3
    ops = block._operands()
    x = scale * torch.randn(2 * t, model.cfg.hidden_size, generator=torch.Generator().manual_seed(4))
    attn = torch.randn(2 * t, block.n_heads * block.hd, generator=torch.Generator().manual_seed(5))
    cos, sin = (c[10 : 10 + t].reshape(1, t, -1).contiguous() for c in (model.cos, model.sin))
    outs = [(mod.layer_pre(x, block.attn_norm.weight, block.attn_norm.eps, *ops[0], cos, sin, block.n_heads, block.n_kv, t),
             mod.layer_post(x, attn, *ops[1], block.ffn_norm.weight, block.ffn_norm.eps, *ops[2], *ops[3]))
            for mod in builds]
    for pre, post in outs[1:]:
        assert torch.equal(pre, outs[0][0]) and torch.equal(post, outs[0][1])


def test_layer_rows_of_a_prefill_equal_rows_run_alone(builds, tiny_target):
    """layer.cpp splits a wide call's element-wise steps (norms, rope, residuals, SiLU) over threads by rows (a
    prompt's prefill: 40 rows here, 2 sequences of 20); each row still gets the bits it gets alone, as a decoding
    step (1 row, on the calling thread) computes it."""
    import copy

    from verispec.models.quant import quantize

    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    block, t = model.layers[0], 20
    ops = block._operands()
    gen = torch.Generator().manual_seed(11)
    x = 3 * torch.randn(2 * t, model.cfg.hidden_size, generator=gen)
    attn = torch.randn(2 * t, block.n_heads * block.hd, generator=gen)
    cos, sin = (c[5 : 5 + t].reshape(1, t, -1).contiguous() for c in (model.cos, model.sin))
    for mod in builds:
        pre = mod.layer_pre(x, block.attn_norm.weight, block.attn_norm.eps, *ops[0], cos, sin, block.n_heads,
                            block.n_kv, t)
        post = mod.layer_post(x, attn, *ops[1], block.ffn_norm.weight, block.ffn_norm.eps, *ops[2], *ops[3])
        for m in range(2 * t):
            one = (c[:, m % t : m % t + 1].contiguous() for c in (cos, sin))
            alone = mod.layer_pre(x[m : m + 1], block.attn_norm.weight, block.attn_norm.eps, *ops[0], *one,
                                  block.n_heads, block.n_kv, 1)
            assert torch.equal(pre[m : m + 1], alone), (mod.isa(), m)
            assert torch.equal(post[m : m + 1], mod.layer_post(x[m : m + 1], attn[m : m + 1], *ops[1],
                                                               block.ffn_norm.weight, block.ffn_norm.eps, *ops[2],
                                                               *ops[3])), (mod.isa(), m)


def test_unseen_keys_and_a_query_that_sees_none(builds):
    """Keys a query does not see change nothing, whatever they hold; a query that sees no key gets zeros."""
    q, k, v = _qkv(1, 4, 2, 2, 10, 16, seed=4)
    mask = torch.zeros(1, 2, 10, dtype=torch.bool)
    mask[0, 0, :6] = True
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 6:], v2[:, :, 6:] = 1e30, float("nan")
    for mod in builds:
        a, b = mod.attention(q, k, v, mask, 0.25), mod.attention(q, k2, v2, mask, 0.25)
        assert torch.equal(a, b)
        assert torch.equal(a[:, :, 1], torch.zeros(1, 4, 16))


def test_models_use_the_kernel_and_agree_with_torch_attention(builds, tiny_target, monkeypatch):
    """The native model's CPU forward goes through the kernel (the count says so), and its logits match the
    same forward on torch's attention."""
    tokens = torch.randint(0, tiny_target.vocab_size, (1, 12), generator=torch.Generator().manual_seed(5))
    calls = []
    real = kernels.attention_kernel()
    assert real is not None

    class Counting:
        def attention(self, *args):
            calls.append(1)
            return real.attention(*args)

    monkeypatch.setattr(kernels, "attention_kernel", lambda: Counting())
    ours = tiny_target.forward(tokens, tiny_target.new_cache(32))
    assert len(calls) == tiny_target.cfg.num_hidden_layers
    monkeypatch.undo()
    monkeypatch.setenv(ATTENTION_ENV, "sdpa")
    assert kernels.attention_kernel() is None
    torch.testing.assert_close(ours, tiny_target.forward(tokens, tiny_target.new_cache(32)), rtol=1e-4, atol=1e-4)


def test_w4a8_layers_run_compiled_and_agree_with_torch_calls(builds, tiny_target, monkeypatch):
    """A w4a8 model's blocks are marked for kernels/layer.cpp, and one block's output matches its torch-call path."""
    import copy

    from verispec.models.kernels import LAYER_ENV
    from verispec.models.llama import attention
    from verispec.models.quant import quantize

    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    assert all(b.w4a8 for b in model.layers)
    x = torch.randn(2, 5, model.cfg.hidden_size, generator=torch.Generator().manual_seed(6))
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    outs = []
    for mode in ("", "python"):
        monkeypatch.setenv(LAYER_ENV, mode)
        cache = model.new_cache(8, batch=2)
        outs.append(model.layers[0](x, 0, cache, model.cos[:5], model.sin[:5], attention(mask, 2, torch.float32, x.device)))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


def test_fused_layer_matches_the_two_call_layer_bit_for_bit(builds, tiny_target):
    """kernels/layer.cpp `layer` (pre, cache write, attention, post in one call) gives the bits of layer_pre +
    Python cache write + attention + layer_post, and writes the same keys and values, for each kind of cache a
    forward meets: one sequence, one row of a batch cache, and a batched forward over rows out of order with their
    own slots and mask (a padded, right-aligned batch: the server's rounds)."""
    import copy

    from verispec.cache import BatchKVCache
    from verispec.models.llama import KernelAttend, attention
    from verispec.models.quant import quantize

    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    block = model.layers[1]
    width, t = model.cfg.hidden_size, 3

    def run(fused: bool, make_cache, batch: int, mask):
        cache, view = make_cache()  # the same random cache for both paths
        attend = attention(mask, batch, torch.float32, torch.device("cpu"))
        assert isinstance(attend, KernelAttend)
        x = torch.randn(batch, t, width, generator=torch.Generator().manual_seed(8))
        cos, sin = model.cos[10 : 10 + t], model.sin[10 : 10 + t]
        out = block(x, 1, view, cos, sin, attend if fused else (lambda q, k, v: attend(q, k, v)))
        return out, cache.k.clone(), cache.v.clone()

    def single():
        c = model.new_cache(16, batch=2)
        c.k.normal_(generator=torch.Generator().manual_seed(7))
        c.v.normal_(generator=torch.Generator().manual_seed(9))
        c.length = 10
        return c, c

    def row():
        c = BatchKVCache(model.cfg.num_hidden_layers, model.cfg.num_key_value_heads, model.cfg.head_dim, 16, rows=3)
        c.k.normal_(generator=torch.Generator().manual_seed(7))
        c.v.normal_(generator=torch.Generator().manual_seed(9))
        c.lengths = [4, 10, 7]
        return c, c.row(1)

    def rows_out_of_order():
        c = BatchKVCache(model.cfg.num_hidden_layers, model.cfg.num_key_value_heads, model.cfg.head_dim, 16, rows=3)
        c.k.normal_(generator=torch.Generator().manual_seed(7))
        c.v.normal_(generator=torch.Generator().manual_seed(9))
        c.lengths = [8, 3, 10]
        slots = torch.tensor([[10, 11, 12], [8, 9, 10]])
        return c, c.rows_view([2, 0], slots, 13)

    seen = torch.ones(2, t, 13, dtype=torch.bool)
    seen[1, :, 11:] = False  # row 0's (cache row 0) keys 11, 12 are scratch past its tokens
    seen[1, 0, 10] = seen[1, 1, 10] = False
    seen[0, 0, 11:] = seen[0, 1, 12] = False
    for make, batch, mask in ((single, 2, torch.ones(t, 13, dtype=torch.bool).tril(10)),
                              (row, 1, torch.ones(t, 13, dtype=torch.bool).tril(10)),
                              (rows_out_of_order, 2, seen[:, None])):
        a, b = run(True, make, batch, mask), run(False, make, batch, mask)
        for u, w in zip(a, b):
            assert torch.equal(u, w), make.__name__


def test_the_layer_stack_gives_the_bits_of_one_call_per_layer(builds, tiny_target, monkeypatch):
    """kernels/layer.cpp's `LayerStack` (all of a w4a8 model's blocks in one call, its buffers kept from forward to
    forward) leaves the logits and every cache slot as one `layer` call per block does: one sequence, a batch cache's
    row, a batched forward over rows out of order with unequal lengths (the server's rounds), and the first blocks only
    (self-speculation)."""
    import copy
    import itertools

    from verispec.batch import forward_rows
    from verispec.cache import BatchKVCache
    from verispec.models.quant import quantize

    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    cfg = model.cfg
    gen = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, cfg.vocab_size, (1, 9), generator=gen)

    def single(layers):
        cache = model.new_cache(32)
        out = [model.forward(prompt, cache, layers=layers)]
        cache.length = 9
        out.append(model.forward(prompt[:, :4], cache, layers=layers))  # a 4-token step over a 9-token prefix
        return out, cache.k, cache.v

    def batched(layers):
        cache = BatchKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 32, rows=3)
        cache.lengths = [0, 0, 0]
        out = forward_rows(model, [[1, 2, 3, 4, 5], [2, 2], [5, 4, 3]], cache, [2, 0, 1], layers=layers)
        for r, n in ((2, 5), (0, 2), (1, 3)):
            cache.lengths[r] = n
        out += forward_rows(model, [[1], [3, 1, 4]], cache, [1, 2], layers=layers)
        row = cache.row(0)
        out.append(model.forward(prompt[:, :3], row, layers=layers))
        return out, cache.k, cache.v

    for isa, run, layers in itertools.product(kernels.available_isas(), (single, batched), (None, 1)):
        monkeypatch.setenv(kernels.ISA_ENV, isa)  # each build's stack, against each build's per-layer calls
        stacked = run(layers)
        assert model._stack is not None and model._stack[1].isa() == isa, "the stack did not run"
        with monkeypatch.context() as m:
            m.setattr(model, "_layer_stack", lambda *a: None)
            looped = run(layers)
        for a, b in zip(stacked[0], looped[0]):
            assert torch.equal(a, b), (isa, run.__name__, layers)
        assert torch.equal(stacked[1], looped[1]) and torch.equal(stacked[2], looped[2]), (isa, run.__name__, layers)


def test_feature_layers_are_the_first_blocks_outputs_through_the_stack_and_block_by_block(builds, tiny_target,
                                                                                           monkeypatch):
    """EAGLE-3's taps: with `feature_layers` (1,) the hidden features are [output after block 1, last block's],
    each equal to a forward that runs only that many blocks, the logits unchanged, for one sequence and batched
    rows, through each build's stack (in segments) and block by block."""
    import copy

    from verispec.batch import forward_rows
    from verispec.cache import BatchKVCache
    from verispec.models.quant import quantize

    model = quantize(copy.deepcopy(tiny_target).float(), "w4a8")
    cfg = model.cfg
    h = cfg.hidden_size
    prompt = torch.randint(0, cfg.vocab_size, (1, 7), generator=torch.Generator().manual_seed(5))

    def single(taps):
        model.feature_layers = taps
        logits, hid = model.forward(prompt, model.new_cache(16), hidden=True)
        _, first = model.forward(prompt, model.new_cache(16), layers=1, hidden=True)
        return logits, hid, first

    def batched(taps):
        model.feature_layers = taps
        cache = BatchKVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, 16, rows=2)
        cache.lengths = [0, 0]
        logits, hid = forward_rows(model, [[1, 2, 3], [4, 5]], cache, [1, 0], hidden=True)
        return logits[0], hid[0][None], None

    try:
        for isa in kernels.available_isas():
            monkeypatch.setenv(kernels.ISA_ENV, isa)
            for run in (single, batched):
                plain_logits, plain, _ = run(())
                for stack in (True, False):
                    with monkeypatch.context() as m:
                        if not stack:
                            m.setattr(model, "_layer_stack", lambda *a: None)
                        logits, hid, first = run((1,))
                    assert not stack or model._stack[1].isa() == isa, "the stack did not run"
                    assert hid.shape[-1] == 2 * h and torch.equal(logits, plain_logits), (isa, run.__name__, stack)
                    assert torch.equal(hid[..., h:], plain), (isa, run.__name__, stack)
                    if first is not None:
                        assert torch.equal(hid[..., :h], first), (isa, stack)
    finally:
        model.feature_layers = ()
