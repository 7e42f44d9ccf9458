"""Writes tests/data/checkpoint_f393f0e.pt: checkpoints in the format of commit f393f0e (the
release before quantized checkpoints loaded with torch.load's default weights_only=True).
Run it at that commit (``git worktree add /tmp/old f393f0e``, then ``PYTHONPATH=/tmp/old
python tests/data/make_checkpoint_f393f0e.py OUT``); tests/test_serialization.py checks that
the current code still loads what it wrote.

The file holds, per recipe, a state_dict of ``Sequential(Linear(32, 32))`` built under
te.quantized_model_init and trained two steps (DelayedScaling's extra state is then not empty),
and the output the model gave on ``x`` right after the state_dict was taken; and one quantized
tensor of each type with its dequantized values. Small on purpose (a few tens of KB)."""

import sys

import torch

import transformer_engine_cpp as te
from transformer_engine_cpp import recipe as R

torch.manual_seed(0)
x_train = torch.randn(32, 32)
x = torch.randn(2, 32)
out = {"x": x, "models": {}, "tensors": {}}
for name, rec in (("Float8CurrentScaling", R.Float8CurrentScaling()),
                  ("DelayedScaling", R.DelayedScaling(amax_history_len=16)),
                  ("MXFP8BlockScaling", R.MXFP8BlockScaling())):
    with te.quantized_model_init(enabled=True, recipe=rec):
        model = te.ops.Sequential(te.ops.Linear(32, 32))
    for _ in range(2):
        with te.autocast(recipe=rec):
            model(x_train.requires_grad_()).sum().backward()
    state = model.state_dict()
    with torch.no_grad(), te.autocast(recipe=rec):
        y = model(x)
    out["models"][name] = {"state": state, "y": y}

w = torch.randn(32, 32, dtype=torch.bfloat16)
quantizers = {
    "Float8Tensor(current)": te.Float8CurrentScalingQuantizer(torch.float8_e4m3fn),
    "Float8Tensor(delayed)": te.Float8Quantizer(torch.full((1,), 2.0), torch.zeros(1),
                                                torch.float8_e4m3fn),
    "MXFP8Tensor": te.MXFP8Quantizer(torch.float8_e4m3fn),
    "Float8BlockwiseQTensor": te.Float8BlockQuantizer(torch.float8_e4m3fn, rowwise=True,
                                                      columnwise=True),
    "NVFP4Tensor": te.NVFP4Quantizer(),
}
for name, q in quantizers.items():
    t = q(w)
    out["tensors"][name] = {"tensor": t, "values": t.dequantize()}

torch.save(out, sys.argv[1])
