"""The one-pass LM head + cross-entropy against the plain route it replaces: ``F.cross_entropy`` on the full
logits. Same values and gradients, chunked or not, padded or not, in fp32 and under bf16 autocast."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from x1_pretrain.model import loss as loss_module
from x1_pretrain.model.loss import linear_cross_entropy


def plain(h, w, y, vocab):
    logits = h @ w.t()
    return F.cross_entropy(logits[..., :vocab].float().reshape(-1, vocab), y.reshape(-1))


def inputs(n=96, c=32, vocab=300, rows=384, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g, requires_grad=True)
    w = torch.randn(rows, c, generator=g) * 0.5
    w[vocab:] = torch.randn(rows - vocab, c, generator=g) * 3  # padding rows that would win if they counted
    w.requires_grad_(True)
    return h, w, torch.randint(0, vocab, (n,), generator=g)


@pytest.fixture(params=["eager", "fused"])
def path(request, monkeypatch):
    """Both ways to the numbers: the in-place eager one, and the fused one torch.compile traces (run eagerly
    here by making the loss believe it is being compiled)."""
    if request.param == "fused":
        monkeypatch.setattr(loss_module, "_is_compiling", lambda: True)
    return request.param


@pytest.mark.parametrize("chunk", [1000, 96, 40, 7])
def test_value_and_gradients_equal_the_plain_cross_entropy(chunk, path):
    h, w, y = inputs()
    ref = plain(h, w, y, 300)
    gh, gw = torch.autograd.grad(ref * 2.5, (h, w))  # a non-unit upstream gradient (accumulation scales it)
    ours = linear_cross_entropy(h, w, y, 300, chunk_tokens=chunk)
    oh, ow = torch.autograd.grad(ours * 2.5, (h, w))
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(oh, gh, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ow, gw, atol=1e-6, rtol=1e-5)
    assert torch.all(ow[300:] == 0)  # padding rows: no probability, so no gradient


def test_batched_hidden_states_and_eval_without_gradients(path):
    h, w, y = inputs(n=64)
    ref = plain(h, w, y, 300)
    with torch.no_grad():
        ours = linear_cross_entropy(h.reshape(4, 16, 32), w, y.reshape(4, 16), 300, chunk_tokens=10)
    assert not ours.requires_grad
    torch.testing.assert_close(ours, ref.detach(), atol=1e-6, rtol=1e-6)


def test_under_bf16_autocast_it_matches_the_plain_route_there(path):
    h, w, y = inputs(n=128, c=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy(F.linear(h, w)[..., :300].float().reshape(-1, 300), y)
        ours = linear_cross_entropy(h, w, y, 300, chunk_tokens=50)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, atol=2e-2, rtol=1e-2)
    gh_ref, gw_ref = torch.autograd.grad(ref, (h, w))
    gh, gw = torch.autograd.grad(ours, (h, w))
    assert gh.dtype == h.dtype and gw.dtype == w.dtype == torch.float32
    torch.testing.assert_close(gh, gh_ref, atol=2e-3, rtol=5e-2)
    torch.testing.assert_close(gw, gw_ref, atol=2e-3, rtol=5e-2)


def test_no_buffer_of_all_tokens_by_vocab_survives_the_forward():
    """What the backward keeps: the gradients for h (N x C) and the head (V x C), never an N x V tensor."""
    h, w, y = inputs(n=512, c=16, vocab=2000, rows=2048)
    big = []

    def pack(t):
        if t.dim() == 2 and t.shape[0] == 512 and t.shape[1] >= 2000:
            big.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        linear_cross_entropy(h, w, y, 2000, chunk_tokens=64).backward()
        assert big == []
        plain(h, w, y, 2000).backward()
    assert big, "the hook should see the plain route's saved logits (else this test proves nothing)"


def test_compiled_gradients_equal_eager_ones(tmp_path, monkeypatch):
    """Inductor on the CPU compiles the loss as the trainer's torch.compile does (a small head and chunking that
    splits the tokens unevenly): the value and both gradients equal the eager ones, and the plain route's."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # a cold, private cache
    import torch._dynamo

    def loss_of(h, w, y):
        return linear_cross_entropy(torch.tanh(h) * 1.5, w, y, 300, chunk_tokens=64) * 2.5

    compiled = torch.compile(loss_of, backend="inductor", fullgraph=True)
    h, w, y = inputs()
    eager_value = loss_of(h, w, y)
    eh, ew = torch.autograd.grad(eager_value, (h, w))
    try:
        value = compiled(h, w, y)
        ch, cw = torch.autograd.grad(value, (h, w))
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(value, eager_value, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ch, eh, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cw, ew, atol=1e-6, rtol=1e-5)
    ref = plain(torch.tanh(h) * 1.5, w, y, 300) * 2.5
    torch.testing.assert_close(ch, torch.autograd.grad(ref, h)[0], atol=1e-6, rtol=1e-5)


def test_the_compiled_loss_has_no_index_put_and_equals_the_eager_one():
    """The graph Inductor gets: the onehot is a comparison (no index_put to stop the fusion), and the values
    equal the eager path's."""
    import torch._dynamo
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    targets: list[str] = []

    def capture(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    def loss_of(h, w, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_cross_entropy(h, w, y, 300, chunk_tokens=64)

    h, w, y = inputs(n=128, c=64)
    try:
        value = torch.compile(loss_of, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(h, w, y)
        gh, gw = torch.autograd.grad(value, (h, w))
    finally:
        torch._dynamo.reset()
    assert targets and not [t for t in targets if "index_put" in t]
    eager = loss_of(h, w, y)
    eh, ew = torch.autograd.grad(eager, (h, w))
    torch.testing.assert_close(value, eager, atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(gh, eh, atol=2e-3, rtol=5e-2)
    torch.testing.assert_close(gw, ew, atol=2e-3, rtol=5e-2)
