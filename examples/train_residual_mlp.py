"""The main job: train a small residual regression MLP built from te.ops, eager and under
torch.compile(fullgraph=True), side by side from the same seed; then the same model in bf16
(eager) and in bf16 under FP8 current scaling (eager), from the same seed and data.

Each block is a pre-norm residual MLP, x + scale * fc2(GELU(fc1(LayerNorm(x)))), built
entirely from te.ops and run as one fuser: the residual branch travels on a named channel
(MakeExtraOutput -> AddExtraInput). Forward: fc1's GEMM applies its bias and the GELU in one
epilogue pass (ForwardLinearBiasActivation) and fc2's GEMM, scaled, accumulates into the
residual (ForwardLinearScaleAdd). Backward: dbias+dgelu in one kernel
(BackwardActivationBias) and the scale folded into fc2's GEMMs (BackwardLinearScale).

The bf16 run converts the same initial model to bf16 (params and inputs; the loss is taken in
fp32). The quantized run is that bf16 model under te.autocast(recipe=...), Float8CurrentScaling
by default (--recipe picks another: delayed, mxfp8, block, nvfp4): its Linear/BasicLinear GEMMs
run on quantized operands (for FP8, E4M3 forward and E5M2 gradients), emulated exactly on CPU
(docs/quantization.md); the backward runs outside the autocast and uses the recipe recorded in
forward.

    python examples/train_residual_mlp.py [--steps 200] [--backend inductor] [--recipe mxfp8]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import time

import torch

import transformer_engine_cpp as te


def residual_block(hidden: int, ffn: int, scale: float) -> te.ops.Sequential:
    return te.ops.Sequential(
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "residual", output_to_caller=False),
        te.ops.LayerNorm(hidden),
        te.ops.Linear(hidden, ffn),
        te.ops.GELU(),
        te.ops.BasicLinear(ffn, hidden),
        te.ops.ConstantScale(scale),
        te.ops.AddExtraInput().set_extra_input_channel(0, "residual"),
    )


class ResidualMLP(torch.nn.Module):
    def __init__(self, d_in: int, hidden: int, ffn: int, depth: int) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(d_in, hidden)
        self.blocks = torch.nn.ModuleList(
            residual_block(hidden, ffn, scale=depth ** -0.5) for _ in range(depth)
        )
        self.head = torch.nn.Linear(hidden, 1)
        with torch.no_grad():  # te.ops biases start at zero; give them a start like nn.Linear
            for block in self.blocks:
                block[2].bias.uniform_(-0.05, 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h).squeeze(-1)


def target(x: torch.Tensor) -> torch.Tensor:
    """A smooth nonlinear regression target."""
    return torch.sin(2.0 * x[:, 0]) * torch.cos(x[:, 1]) + 0.5 * x[:, 2] * x[:, 3] - 0.3 * x[:, 4] ** 2


#: --recipe: the quantized run's recipe
RECIPES = {
    "current": te.recipe.Float8CurrentScaling,
    "delayed": te.recipe.DelayedScaling,
    "mxfp8": te.recipe.MXFP8BlockScaling,
    "block": te.recipe.Float8BlockScaling,
    "nvfp4": te.recipe.NVFP4BlockScaling,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--ffn", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--print-every", type=int, default=20)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="current",
                        help="the quantization recipe of the quantized run")
    args = parser.parse_args()

    torch.manual_seed(0)
    d_in = 8
    eager_model = ResidualMLP(d_in, args.hidden, args.ffn, args.depth)
    compiled_source = copy.deepcopy(eager_model)
    compiled_model = torch.compile(compiled_source, fullgraph=True, backend=args.backend)
    bf16_model = copy.deepcopy(eager_model).to(torch.bfloat16)
    fp8_model = copy.deepcopy(eager_model).to(torch.bfloat16)
    opt_e = torch.optim.Adam(eager_model.parameters(), lr=args.lr)
    opt_c = torch.optim.Adam(compiled_source.parameters(), lr=args.lr)
    opt_b = torch.optim.Adam(bf16_model.parameters(), lr=args.lr)
    opt_f = torch.optim.Adam(fp8_model.parameters(), lr=args.lr)
    fp8_recipe = RECIPES[args.recipe]()

    gen = torch.Generator().manual_seed(1)
    x_val = torch.randn(1024, d_in, generator=gen)
    y_val = target(x_val)

    print(f"transformer_engine_cpp {te.__version__} | torch {torch.__version__} | "
          f"threads {torch.get_num_threads()} | backend {args.backend}")
    print(f"model: {args.depth} pre-norm residual blocks [MakeExtraOutput, LayerNorm, Linear, GELU, "
          "BasicLinear, ConstantScale, AddExtraInput]")
    print(f"       hidden {args.hidden}, ffn {args.ffn}, batch {args.batch}, {args.steps} Adam steps")
    # the plan a training step of one block runs (Sequential.fusion_plan: one plan per fuser)
    plan, = eager_model.blocks[0].fusion_plan(torch.zeros(1, args.hidden), requires_grad=True)
    print("fusion plan, forward: ", [type(op).__name__ for op, _ in plan.forward_ops])
    print("fusion plan, backward:", [type(op).__name__ for op, _ in plan.backward_ops])
    print(f"quantized run: bf16 under te.autocast(recipe={type(fp8_recipe).__name__}())")
    print(f"{'step':>5} {'eager loss':>12} {'compiled loss':>14} {'|diff|':>10} "
          f"{'bf16 loss':>11} {args.recipe + ' loss':>11}")

    max_diff = 0.0
    times = {"eager": 0.0, "compiled": 0.0, "bf16": 0.0, "fp8": 0.0}
    losses = []
    runs = (("eager", eager_model, opt_e, torch.float32, None),
            ("compiled", compiled_model, opt_c, torch.float32, None),
            ("bf16", bf16_model, opt_b, torch.bfloat16, None),
            ("fp8", fp8_model, opt_f, torch.bfloat16, fp8_recipe))
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, d_in, generator=gen)
        y = target(x)
        step_losses = []
        for name, model, opt, dtype, recipe in runs:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with te.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
                out = model(x.to(dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y)
            loss.backward()
            opt.step()
            if step > 1:  # the first step of the compiled model includes compilation
                times[name] += time.perf_counter() - t0
            step_losses.append(loss.item())
        diff = abs(step_losses[0] - step_losses[1])
        max_diff = max(max_diff, diff)
        losses.append(step_losses)
        if step == 1 or step % args.print_every == 0 or step == args.steps:
            print(f"{step:>5} {step_losses[0]:>12.6f} {step_losses[1]:>14.6f} {diff:>10.2e} "
                  f"{step_losses[2]:>11.6f} {step_losses[3]:>11.6f}")

    with torch.no_grad():
        val_e = torch.nn.functional.mse_loss(eager_model(x_val), y_val).item()
        val_c = torch.nn.functional.mse_loss(compiled_model(x_val), y_val).item()
        val_b = torch.nn.functional.mse_loss(bf16_model(x_val.bfloat16()).float(), y_val).item()
        with te.autocast(recipe=fp8_recipe):
            val_f = torch.nn.functional.mse_loss(fp8_model(x_val.bfloat16()).float(),
                                                 y_val).item()
    first, last = losses[0][0], losses[-1][0]
    print(f"validation MSE: eager {val_e:.6f}, compiled {val_c:.6f}, bf16 {val_b:.6f}, "
          f"fp8 {val_f:.6f} (target variance {y_val.var().item():.4f})")
    print(f"training loss fell {first / last:.1f}x ({first:.4f} -> {last:.4f})")
    steps_timed = max(args.steps - 1, 1)
    print("mean step time: " + ", ".join(f"{k} {1e3 * v / steps_timed:.2f} ms"
                                         for k, v in times.items()))
    print(f"max |eager - compiled| loss difference over {args.steps} steps: {max_diff:.3e}")
    if not max_diff < 1e-3 or not last < first:
        raise SystemExit("eager and compiled training diverged, or the loss did not fall")
    # FP8 against bf16: final loss = mean of the last 10 steps (one batch's loss is noisy)
    tail = min(10, len(losses))
    def final(i):
        return sum(step_losses[i] for step_losses in losses[-tail:]) / tail
    b_first, b_last = losses[0][2], final(2)
    f_first, f_last = losses[0][3], final(3)
    print(f"bf16 loss fell {b_first / b_last:.1f}x ({b_first:.4f} -> {b_last:.4f}), "
          f"fp8 loss fell {f_first / f_last:.1f}x ({f_first:.4f} -> {f_last:.4f}) "
          f"(final = mean of the last {tail} steps); fp8 / bf16 final loss {f_last / b_last:.2f}")
    if not f_last < f_first or not f_last < 2 * b_last:
        raise SystemExit("FP8 training did not fall, or ended above 2x the bf16 loss")


if __name__ == "__main__":
    main()
