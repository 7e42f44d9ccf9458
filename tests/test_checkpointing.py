"""Deferred (meta-device) initialisation and state_dict round trips of every parameterised op
(TransformerEngine's TestCheckpointing shape: save, load into a fresh model, bit-exact outputs and
gradients, and an optimizer that continues training identically)."""

from __future__ import annotations

import io

import pytest
import torch

import transformer_engine_cpp as te

PARAMETERISED = {
    "Bias": lambda device=None: te.ops.Bias(24, device=device),
    "LayerNorm": lambda device=None: te.ops.LayerNorm(24, device=device),
    "LayerNorm(zero_centered_gamma)": lambda device=None: te.ops.LayerNorm(
        24, device=device, zero_centered_gamma=True),
    "RMSNorm": lambda device=None: te.ops.RMSNorm(24, device=device),
    "BasicLinear": lambda device=None: te.ops.BasicLinear(24, 24, device=device),
    "Linear": lambda device=None: te.ops.Linear(24, 24, device=device),
}


def model_with_every_parameterised_op(seed=0):
    torch.manual_seed(seed)
    model = te.ops.Sequential(
        te.ops.LayerNorm(24),
        te.ops.Bias(24),
        te.ops.GELU(),
        te.ops.RMSNorm(24, zero_centered_gamma=True),
        te.ops.SwiGLU(),
        te.ops.Linear(12, 24),
        te.ops.AddExtraInput(),
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def train_step(model, opt, x):
    opt.zero_grad(set_to_none=True)
    y = model(x, x)
    loss = y.pow(2).mean()
    loss.backward()
    opt.step()
    return loss.detach()


@pytest.mark.parametrize("name", list(PARAMETERISED))
def test_meta_device_materialises_on_first_forward(name):
    x = torch.randn(3, 24, requires_grad=True)
    torch.manual_seed(0)
    eager = PARAMETERISED[name]()
    deferred = PARAMETERISED[name](device="meta")
    assert all(p.device.type == "meta" for p in deferred.parameters())
    seq = te.ops.Sequential(deferred, te.ops.ReLU())
    torch.manual_seed(0)  # the deferred initialisation draws what the eager one drew
    y = seq(x)
    assert all(p.device.type == "cpu" for p in deferred.parameters())
    for (n, p), q in zip(deferred.named_parameters(), eager.parameters()):
        assert torch.equal(p, q), n  # same initial values as a directly built op
    y.sum().backward()
    # the fuser used the new parameters: their grads arrived (TransformerEngine keeps stale ones)
    assert all(p.grad is not None for p in deferred.parameters())


@pytest.mark.parametrize("name", list(PARAMETERISED))
def test_reset_parameters_materialises_and_optimizer_sees_new_params(name):
    op = PARAMETERISED[name](device="meta")
    op.reset_parameters()
    assert all(p.device.type == "cpu" for p in op.parameters())
    opt = torch.optim.SGD(op.parameters(), lr=0.1)
    before = [p.detach().clone() for p in op.parameters()]
    out = op(torch.randn(4, 24))
    (out * torch.randn_like(out)).sum().backward()
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, op.parameters()))


def test_materialised_model_compiles():
    model = te.ops.Sequential(te.ops.LayerNorm(16, device="meta"), te.ops.Bias(16, device="meta"),
                              te.ops.GELU())
    for m in model:
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 16, requires_grad=True)
    compiled(x).sum().backward()
    assert x.grad is not None and model[1].bias.grad is not None


def test_state_dict_round_trip_is_bit_exact_and_training_continues():
    torch.manual_seed(1)
    xs = [torch.randn(5, 24) for _ in range(6)]
    model = model_with_every_parameterised_op()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for x in xs[:3]:
        train_step(model, opt, x)

    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    expected_keys = {"0.weight", "0.bias", "1.bias", "3.weight", "5.basic_ops.0.weight",
                     "5.basic_ops.1.bias"}
    params = {k for k in state["model"] if not k.endswith("._extra_state")}
    assert params == expected_keys
    assert all(state["model"][k].numel() == 0 for k in state["model"] if k.endswith("_extra_state"))

    restored = model_with_every_parameterised_op(seed=123)  # different initial values
    restored.load_state_dict(state["model"])
    opt2 = torch.optim.Adam(restored.parameters(), lr=1e-2)
    opt2.load_state_dict(state["opt"])

    # bit-exact outputs and gradients after reload
    model.zero_grad(set_to_none=True)
    x = xs[3].clone().requires_grad_()
    x2 = xs[3].clone().requires_grad_()
    y, y2 = model(x, x), restored(x2, x2)
    assert torch.equal(y, y2)
    y.pow(2).sum().backward()
    y2.pow(2).sum().backward()
    assert torch.equal(x.grad, x2.grad)
    for (n, p), p2 in zip(model.named_parameters(), restored.parameters()):
        assert torch.equal(p.grad, p2.grad), n

    # the optimizer continues identically
    for x in xs[3:]:
        l1, l2 = train_step(model, opt, x), train_step(restored, opt2, x)
        assert torch.equal(l1, l2)
    for (n, p), p2 in zip(model.named_parameters(), restored.parameters()):
        assert torch.equal(p, p2), n
