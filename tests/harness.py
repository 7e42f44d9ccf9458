"""Running an OpCase: eager against the float64 reference, compiled against eager."""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
import torch
from torch.library import opcheck

import transformer_engine_cpp as te

LAYOUTS = {
    # name: (leading shape, non-contiguous input)
    "one_row": ((1,), False),
    "rows": ((7,), False),
    "leading_dims": ((2, 3), False),
    "non_contiguous": ((5,), True),
    # no rows: forward and backward run, parameter grads are zeros of the parameters' shapes
    "zero_rows": ((0,), False),
}


# The devices the harness runs on: CUDA only where a GPU is present.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


@contextlib.contextmanager
def skip_missing_cuda_kernel():
    """Skips a CUDA run that reaches a te_cpp op without a CUDA kernel (naming the op)."""
    try:
        yield
    except NotImplementedError as e:
        match = re.search(r"run '(te_cpp::\w+)' with arguments from the 'CUDA' backend", str(e))
        if match is None:
            raise
        pytest.skip(f"{match.group(1)} has no CUDA kernel yet")


def to_device(obj, device):
    """``obj`` (a tensor, or a tuple/list/dict of them and constants) with its tensors moved
    to ``device`` (opcheck samples are built on the CPU)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to(device).requires_grad_(obj.requires_grad)
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    return obj


def make_input(lead, tail, dtype, *, non_contiguous=False, scale=1.0, requires_grad=True,
               device="cpu"):
    """A (*lead, *tail) input; non-contiguous: every other element of a twice-as-wide one.
    Drawn on the CPU, so every device gets the same values."""
    if non_contiguous:
        base = torch.randn(*lead, *tail[:-1], 2 * tail[-1]) * scale
        x = base.to(dtype).to(device)[..., ::2]
        assert not x.is_contiguous()
    else:
        x = (torch.randn(*lead, *tail) * scale).to(dtype).to(device)
    return x.detach().requires_grad_(requires_grad)


def build(case, dtype, seed=1234, device="cpu"):
    """The case's ops in a Sequential on ``device``, parameters set to random values (drawn on
    the CPU)."""
    torch.manual_seed(seed)
    seq = te.ops.Sequential(*case.make(dtype))
    with torch.no_grad():
        for p in seq.parameters():
            p.copy_(torch.randn_like(p))
    return seq.to(device)


def dequantized(t):
    """A quantized tensor's values (its dequantization); any other tensor as it is."""
    return t.dequantize() if isinstance(t, te.QuantizedTensor) else t


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def inputs_for(case, dtype, layout, seed=4321, device="cpu", lead=None):
    """The case's input and extra inputs in ``layout``; ``lead``: leading dims instead of the
    layout's."""
    layout_lead, non_contiguous = LAYOUTS[layout]
    lead = layout_lead if lead is None else lead
    torch.manual_seed(seed)
    x = make_input(lead, case.tail, dtype, non_contiguous=non_contiguous,
                   scale=case.input_scale, device=device)
    if case.extra_shape is None:
        extras = [make_input(lead, case.extra_input_tail or case.tail, dtype,
                             scale=case.input_scale, requires_grad=case.extra_requires_grad,
                             device=device)
                  for _ in range(case.num_extra_inputs)]
    else:
        shape = tuple(case.extra_shape(lead, case.features))
        extras = [make_input(shape[:-1], shape[-1:], dtype, non_contiguous=non_contiguous,
                             requires_grad=case.extra_requires_grad, device=device)
                  for _ in range(case.num_extra_inputs)]
    return x, extras


class _RoundForward(torch.autograd.Function):
    """Rounds to a dtype in forward; passes the float64 gradient through unrounded."""

    @staticmethod
    def forward(ctx, t, dtype):
        return t.to(dtype).to(torch.float64)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _RoundBackward(torch.autograd.Function):
    """Identity in forward; rounds the gradient to a dtype in backward."""

    @staticmethod
    def forward(ctx, t, dtype):
        ctx.dtype = dtype
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).to(torch.float64), None


class RefParams(dict):
    """The reference's view of the parameters (float64 copies, by name), plus ``round(t)``:
    rounding to the working dtype where the implementation stores a forward intermediate
    between two ops. Gradients are not rounded: a fused backward keeps them in fp32."""

    def __init__(self, params: dict, dtype: torch.dtype):
        super().__init__(params)
        self.dtype = dtype

    def round(self, t: torch.Tensor) -> torch.Tensor:
        return _RoundForward.apply(t, self.dtype)

    def round_grad(self, t: torch.Tensor) -> torch.Tensor:
        """Marks where the implementation stores a *gradient* in the working dtype between two
        backward ops (e.g. dact feeding a dgrad GEMM)."""
        return _RoundBackward.apply(t, self.dtype)


def reference_run(case, seq, x, extras, grads):
    """float64 reference outputs and gradients (input, extras, parameters by name), computed
    on the CPU whatever device the ops run on."""
    params = RefParams({name: p.detach().double().cpu().requires_grad_(p.requires_grad)
                        for name, p in seq.named_parameters()}, x.dtype)
    x64 = x.detach().double().cpu().requires_grad_(x.requires_grad)
    extras64 = [e.detach().double().cpu().requires_grad_(e.requires_grad) for e in extras]
    outs = as_tuple(case.reference(params, x64, *extras64))
    torch.autograd.backward(outs, [g.double().cpu() for g in grads])
    return outs, x64.grad, [e.grad for e in extras64], {n: p.grad for n, p in params.items()}


def eager_run(seq, x, extras, grads):
    outs = as_tuple(seq(x, *extras))
    torch.autograd.backward(outs, list(grads))
    return outs, x.grad, [e.grad for e in extras], {n: p.grad for n, p in seq.named_parameters()}


def random_grads_like(outs, seed=99):
    torch.manual_seed(seed)
    return [torch.randn(o.shape, dtype=o.dtype).to(o.device) for o in outs]


# ATen ops that copy a tensor's bytes: an aot graph holding one copies what eager never does
# (our eager pipeline hands every op output on as it is)
COPY_OPS = ("aten.clone.", "aten.copy.", "aten.copy_.", "aten._to_copy.", "aten.contiguous.")


def copy_nodes(graph_module) -> list[str]:
    """The nodes of an aot (forward or backward) graph that copy a tensor, as strings."""
    return [f"{n.name} = {n.target}" for n in graph_module.graph.nodes
            if n.op == "call_function" and str(n.target).startswith(COPY_OPS)]


def clone_leaf(t):
    return t.detach().clone().requires_grad_(t.requires_grad)


def pair_fusion(first: type, second: type, make):
    """A fusion function (for register_*_fusion) replacing each consecutive pair of ops of the
    exact classes (first, second) with ``make([a, b])``, through the fusers' own window scan."""
    from transformer_engine_cpp.ops.fused._window import fuse_windows

    def fuse(ops, *, recipe=None):
        def match(ops, i):
            if i + 1 < len(ops) and type(ops[i]) is first and type(ops[i + 1]) is second:
                return make([ops[i], ops[i + 1]]), 2
            return None

        return fuse_windows(ops, match)

    return fuse


def check_quantized_weights_compile_checkpoint_cast(model, make, recipe, x, tmp_path, cls, *,
                                                    inputs=None, weight_of=None):
    """The shared end of the quantized-weight tests (te.quantized_model_init): ``model``
    compiled (fullgraph, aot_eager) equals eager under ``recipe``; its state_dict saved and
    loaded with torch.load's default (weights_only=True) into a fresh quantized ``make()``
    gives the same weight values; a bf16 cast keeps the weight a ``cls`` with the new nominal
    dtype. ``inputs``: the model's arguments (default ``(x,)``); ``weight_of(model)``: the
    quantized weight checked (default ``model[0].weight``)."""
    inputs = (x,) if inputs is None else inputs
    weight_of = weight_of or (lambda m: m[0].weight)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with te.autocast(recipe=recipe):
        assert torch.equal(compiled(*inputs), model(*inputs))
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    with te.quantized_model_init(recipe=recipe):
        restored = make()
    restored.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    assert torch.equal(weight_of(restored).dequantize(), weight_of(model).dequantize())
    model.bfloat16()
    assert isinstance(weight_of(model), cls) and weight_of(model).dtype == torch.bfloat16


def draws_from_generator(op) -> bool:
    """Whether a custom op draws from torch's generator (tagged nondeterministic_seeded): two
    calls give different values unless torch.manual_seed comes before each."""
    overload = op.default if isinstance(op, torch._ops.OpOverloadPacket) else op
    return torch.Tag.nondeterministic_seeded in overload.tags


def opcheck_sample(op, args):
    """torch.library.opcheck of one sample. An op that draws from torch's generator skips
    test_aot_dispatch_dynamic, which compares the values of two draws; tests/
    test_random_seeds.py compares its compiled draws with eager's after the same seed."""
    if draws_from_generator(op):
        return opcheck(op, args, test_utils=("test_schema", "test_autograd_registration",
                                             "test_faketensor"))
    return opcheck(op, args)


def eager_and_inductor_grads(model, x0, dy, recipe, *extra_args) -> list:
    """[eager, inductor]: the gradients (input, then parameters) of one step of copies of
    ``model`` under ``recipe``, each from torch.manual_seed(1), for bit-for-bit comparisons."""
    grads = []
    for compiled in (False, True):
        m = copy.deepcopy(model)
        run = torch.compile(m, fullgraph=True) if compiled else m
        x = x0.clone().requires_grad_()
        torch.manual_seed(1)
        with te.autocast(recipe=recipe):
            run(x, *extra_args).backward(dy)
        grads.append([x.grad, *[p.grad for p in m.parameters()]])
    return grads

