"""The main job: train a small residual regression MLP built from te.ops, eager and under
torch.compile(fullgraph=True), side by side with the same model in plain PyTorch (eager and
compiled), all from the same initial weights and data; then our model in bf16 (eager) and in
bf16 under FP8 current scaling (eager). It prints the loss curves, the fusion plan of a block
and the step times side by side, and draws the loss curves and the step times into a PNG.

Each block is a pre-norm residual MLP, x + scale * fc2(GELU(fc1(LayerNorm(x)))), built
entirely from te.ops and run as one fuser: the residual branch travels on a named channel
(MakeExtraOutput -> AddExtraInput). Forward: fc1's GEMM applies its bias and the GELU in one
epilogue pass (ForwardLinearBiasActivation) and fc2's GEMM, scaled, accumulates into the
residual (ForwardLinearScaleAdd). Backward: dbias+dgelu in one kernel
(BackwardActivationBias) and the scale folded into fc2's GEMMs (BackwardLinearScale). The
plain twin is transformer_engine_cpp.testing.reference.PreNormMLP (nn.LayerNorm, nn.Linear,
tanh GELU) with our initial weights copied in.

The bf16 run converts the same initial model to bf16 (params and inputs; the loss is taken in
fp32). The quantized run is that bf16 model under te.autocast(recipe=...), Float8CurrentScaling
by default (--recipe picks another: delayed, mxfp8, block, nvfp4): its Linear/BasicLinear GEMMs
run on quantized operands (for FP8, E4M3 forward and E5M2 gradients), emulated exactly on CPU
(docs/quantization.md); the backward runs outside the autocast and uses the recipe recorded in
forward.

    python examples/train_residual_mlp.py [--steps 200] [--backend inductor] [--recipe mxfp8]
        [--plot examples/out/demo.png]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import pathlib
import sys
import time

import torch

import transformer_engine_cpp as te
from transformer_engine_cpp.testing.reference import PreNormMLP

#: where the PNG goes by default (git-ignored)
DEFAULT_PLOT = pathlib.Path(__file__).resolve().parent / "out" / "demo.png"


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
    """embed -> depth residual blocks -> head; the blocks are te.ops (``plain=False``) or
    plain PyTorch (``plain=True``), with parameters in the same order."""

    def __init__(self, d_in: int, hidden: int, ffn: int, depth: int, plain: bool = False) -> None:
        super().__init__()
        scale = depth ** -0.5
        self.embed = torch.nn.Linear(d_in, hidden)
        self.blocks = torch.nn.ModuleList(
            PreNormMLP(hidden, ffn, scale=scale, fc2_bias=False) if plain
            else residual_block(hidden, ffn, scale) for _ in range(depth)
        )
        self.head = torch.nn.Linear(hidden, 1)
        if not plain:
            with torch.no_grad():  # te.ops biases start at zero; give them a start like nn.Linear
                for block in self.blocks:
                    block[2].bias.uniform_(-0.05, 0.05)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h).squeeze(-1)


def plain_twin(model: ResidualMLP, d_in: int, hidden: int, ffn: int, depth: int) -> ResidualMLP:
    """The same model in plain PyTorch, with ``model``'s current weights."""
    plain = ResidualMLP(d_in, hidden, ffn, depth, plain=True)
    with torch.no_grad():
        pairs = list(zip(plain.named_parameters(), model.named_parameters(), strict=True))
        for (name, p), (ours_name, q) in pairs:
            if p.shape != q.shape:
                raise RuntimeError(f"plain {name} {list(p.shape)} != ours {ours_name} "
                                   f"{list(q.shape)}")
            p.copy_(q)
    return plain


def target(x: torch.Tensor) -> torch.Tensor:
    """A smooth nonlinear regression target."""
    return (torch.sin(2.0 * x[:, 0]) * torch.cos(x[:, 1]) + 0.5 * x[:, 2] * x[:, 3]
            - 0.3 * x[:, 4] ** 2)


#: --recipe: the quantized run's recipe
RECIPES = {
    "current": te.recipe.Float8CurrentScaling,
    "delayed": te.recipe.DelayedScaling,
    "mxfp8": te.recipe.MXFP8BlockScaling,
    "block": te.recipe.Float8BlockScaling,
    "nvfp4": te.recipe.NVFP4BlockScaling,
}


def shown(path: pathlib.Path) -> str:
    """``path`` relative to the working directory where it is under it."""
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def plot(path: pathlib.Path, losses: dict, step_ms: dict, title: str) -> bool:
    """Loss curves (log scale) and mean step times into ``path``; False without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415  (optional: only the picture needs it)
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (ax_loss, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5),
                                           gridspec_kw={"width_ratios": [3, 2]})
    styles = {"ours eager": ("C0", "-", 3.0), "ours compiled": ("C1", "--", 1.5),
              "PyTorch eager": ("C2", "-", 3.0), "PyTorch compiled": ("C3", ":", 1.5)}
    for name, (color, style, width) in styles.items():
        ys = losses[name]
        ax_loss.plot(range(1, len(ys) + 1), ys, color=color, linestyle=style, linewidth=width,
                     label=name)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("Adam step")
    ax_loss.set_ylabel("training loss (MSE)")
    ax_loss.set_title("loss curves (fp32; same weights and data)")
    ax_loss.legend()
    names = list(step_ms)
    colors = [styles.get(n, ("C7",))[0] for n in names]
    bars = ax_time.bar(range(len(names)), [step_ms[n] for n in names], color=colors)
    ax_time.bar_label(bars, fmt="%.1f", fontsize=8)
    ax_time.set_xticks(range(len(names)), [n.replace(" ", "\n", 1) for n in names], fontsize=8)
    ax_time.set_ylabel("mean step time (ms)")
    ax_time.set_title("step time (forward, backward, Adam)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


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
    parser.add_argument("--plot", type=pathlib.Path, default=DEFAULT_PLOT,
                        help="the PNG of the loss curves and step times (default: %(default)s)")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows at once, even through a pipe

    torch.manual_seed(0)
    d_in = 8
    eager_model = ResidualMLP(d_in, args.hidden, args.ffn, args.depth)
    compiled_source = copy.deepcopy(eager_model)
    compiled_model = torch.compile(compiled_source, fullgraph=True, backend=args.backend)
    plain_model = plain_twin(eager_model, d_in, args.hidden, args.ffn, args.depth)
    plain_source = copy.deepcopy(plain_model)
    plain_compiled = torch.compile(plain_source, fullgraph=True, backend=args.backend)
    bf16_model = copy.deepcopy(eager_model).to(torch.bfloat16)
    fp8_model = copy.deepcopy(eager_model).to(torch.bfloat16)
    fp8_recipe = RECIPES[args.recipe]()
    fp8_name = f"ours {args.recipe}"

    gen = torch.Generator().manual_seed(1)
    x_val = torch.randn(1024, d_in, generator=gen)
    y_val = target(x_val)

    print(f"transformer_engine_cpp {te.__version__} | torch {torch.__version__} | "
          f"threads {torch.get_num_threads()} | backend {args.backend}")
    print(f"model: {args.depth} pre-norm residual blocks [MakeExtraOutput, LayerNorm, Linear, "
          "GELU, BasicLinear, ConstantScale, AddExtraInput]")
    print(f"       hidden {args.hidden}, ffn {args.ffn}, batch {args.batch}, "
          f"{args.steps} Adam steps")
    print("plain PyTorch twin: the same model from nn.LayerNorm, nn.Linear and tanh GELU "
          "(testing/reference.PreNormMLP), our initial weights copied in")
    # The plan a training step of one block runs: Sequential.fusion_plan, one plan per fuser.
    plan, = eager_model.blocks[0].fusion_plan(torch.zeros(1, args.hidden), requires_grad=True)
    print("fusion plan of a block (Sequential.fusion_plan):")
    print("  forward: ", [type(op).__name__ for op, _ in plan.forward_ops])
    print("  backward:", [type(op).__name__ for op, _ in plan.backward_ops])
    print(f"quantized run: bf16 under te.autocast(recipe={type(fp8_recipe).__name__}())")

    # name: (model, parameters' module, dtype, recipe, compiled)
    runs = {
        "ours eager": (eager_model, eager_model, torch.float32, None, False),
        "ours compiled": (compiled_model, compiled_source, torch.float32, None, True),
        "PyTorch eager": (plain_model, plain_model, torch.float32, None, False),
        "PyTorch compiled": (plain_compiled, plain_source, torch.float32, None, True),
        "ours bf16": (bf16_model, bf16_model, torch.bfloat16, None, False),
        fp8_name: (fp8_model, fp8_model, torch.bfloat16, fp8_recipe, False),
    }
    optimizers = {name: torch.optim.Adam(params.parameters(), lr=args.lr)
                  for name, (_, params, _, _, _) in runs.items()}
    times = dict.fromkeys(runs, 0.0)
    losses = {name: [] for name in runs}

    def header() -> None:
        print(f"{'step':>5} {'ours eager':>12} {'ours compiled':>14} {'|diff|':>9} "
              f"{'torch eager':>12} {'torch compiled':>15} {'ours bf16':>10} "
              f"{args.recipe:>9}   (training loss)")

    def row(step: int) -> None:
        ls = [losses[name][-1] for name in runs]
        print(f"{step:>5} {ls[0]:>12.6f} {ls[1]:>14.6f} {abs(ls[0] - ls[1]):>9.2e} "
              f"{ls[2]:>12.6f} {ls[3]:>15.6f} {ls[4]:>10.6f} {ls[5]:>9.6f}")

    t_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, d_in, generator=gen)
        y = target(x)
        for name, (model, _, dtype, recipe, compiled) in runs.items():
            if step == 1 and compiled:
                what = "our te.ops model" if name.startswith("ours") else "the PyTorch model"
                print(f"compiling {what} (torch.compile, backend {args.backend}; the first "
                      "call compiles forward and backward) ...")
            t0 = time.perf_counter()
            opt = optimizers[name]
            opt.zero_grad(set_to_none=True)
            with te.autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext():
                out = model(x.to(dtype))
            loss = torch.nn.functional.mse_loss(out.float(), y)
            loss.backward()
            opt.step()
            elapsed = time.perf_counter() - t0
            if step > 1:  # the first step of a compiled model includes compilation
                times[name] += elapsed
            elif compiled:
                print(f"  compiled; its first step took {elapsed:.1f} s")
            losses[name].append(loss.item())
        if step == 1:
            header()
        if step == 1 or step % args.print_every == 0 or step == args.steps:
            row(step)

    print(f"trained in {time.perf_counter() - t_start:.1f} s; evaluating (the compiled model "
          "compiles its no-grad graph first) ...")
    with torch.no_grad():
        val_e = torch.nn.functional.mse_loss(eager_model(x_val), y_val).item()
        val_c = torch.nn.functional.mse_loss(compiled_model(x_val), y_val).item()
        val_p = torch.nn.functional.mse_loss(plain_model(x_val), y_val).item()
        val_b = torch.nn.functional.mse_loss(bf16_model(x_val.bfloat16()).float(), y_val).item()
        with te.autocast(recipe=fp8_recipe):
            val_f = torch.nn.functional.mse_loss(fp8_model(x_val.bfloat16()).float(),
                                                 y_val).item()
    ours, ours_c = losses["ours eager"], losses["ours compiled"]
    first, last = ours[0], ours[-1]
    max_diff = max(abs(a - b) for a, b in zip(ours, ours_c))
    max_plain = max(abs(a - b) for a, b in zip(ours, losses["PyTorch eager"]))
    print(f"validation MSE: ours eager {val_e:.6f}, ours compiled {val_c:.6f}, PyTorch eager "
          f"{val_p:.6f}, ours bf16 {val_b:.6f}, {fp8_name} {val_f:.6f} "
          f"(target variance {y_val.var().item():.4f})")
    print(f"training loss fell {first / last:.1f}x ({first:.4f} -> {last:.4f})")

    steps_timed = max(args.steps - 1, 1)
    step_ms = {name: 1e3 * t / steps_timed for name, t in times.items()}
    print(f"mean step time, ms (forward, backward, Adam; steps 2..{args.steps}):")
    print(f"  {'':<28} {'eager':>8} {'compiled':>9}")
    print(f"  {'ours (te.ops)':<28} {step_ms['ours eager']:>8.2f} "
          f"{step_ms['ours compiled']:>9.2f}")
    print(f"  {'plain PyTorch':<28} {step_ms['PyTorch eager']:>8.2f} "
          f"{step_ms['PyTorch compiled']:>9.2f}")
    print(f"  {'ours bf16':<28} {step_ms['ours bf16']:>8.2f}")
    print(f"  {'ours bf16 under ' + args.recipe:<28} {step_ms[fp8_name]:>8.2f}")
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > cores:
        print(f"  (load average {load:.1f} on {cores} cores: other processes share the CPUs, "
              "so these times are noisy)")
    print(f"max |ours eager - ours compiled| loss difference over {args.steps} steps: "
          f"{max_diff:.3e}")
    print(f"max |ours eager - PyTorch eager| loss difference over {args.steps} steps: "
          f"{max_plain:.3e}")

    title = (f"transformer_engine_cpp {te.__version__}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} threads, backend {args.backend}: hidden {args.hidden}, "
             f"ffn {args.ffn}, depth {args.depth}, batch {args.batch}")
    if plot(args.plot, losses, step_ms, title):
        print(f"plot: {shown(args.plot)} (loss curves and step times)")
    else:
        print("plot: skipped, matplotlib is not installed (pip install matplotlib; `make demo` "
              "installs it where an index is reachable)")

    if not max_diff < 1e-3 or not last < first:
        raise SystemExit("eager and compiled training diverged, or the loss did not fall")
    if not max_plain < 1e-3:
        raise SystemExit("our model and its plain PyTorch twin trained apart")
    # FP8 against bf16: final loss = mean of the last 10 steps (one batch's loss is noisy)
    tail = min(10, args.steps)

    def final(name: str) -> float:
        return sum(losses[name][-tail:]) / tail

    b_first, b_last = losses["ours bf16"][0], final("ours bf16")
    f_first, f_last = losses[fp8_name][0], final(fp8_name)
    print(f"bf16 loss fell {b_first / b_last:.1f}x ({b_first:.4f} -> {b_last:.4f}), "
          f"{args.recipe} loss fell {f_first / f_last:.1f}x ({f_first:.4f} -> {f_last:.4f}) "
          f"(final = mean of the last {tail} steps); {args.recipe} / bf16 final loss "
          f"{f_last / b_last:.2f}")
    if not f_last < f_first or not f_last < 2 * b_last:
        raise SystemExit("FP8 training did not fall, or ended above 2x the bf16 loss")


if __name__ == "__main__":
    main()
