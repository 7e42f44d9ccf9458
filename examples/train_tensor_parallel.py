"""Tensor and sequence parallelism with te.ops: a Megatron-style residual MLP block trained on
every rank of torchrun, checked step by step against the same full-size model trained in one
process.

    block(x) = x + fc2(GELU(fc1(LayerNorm(x))))           x: [tokens, hidden]
    fc1 = Linear(hidden, ffn, tensor_parallel_mode="column", sequence_parallel=True)
    fc2 = Linear(ffn, hidden, tensor_parallel_mode="row", sequence_parallel=True)

With sequence parallelism each rank holds tokens / world rows of x (dim 0 is split over the
ranks). LayerNorm and the residual run on that chunk; fc1 all-gathers it before its GEMM and
produces this rank's ffn / world features of every token; GELU runs on that slice; fc2
multiplies it by its slice of the weight and reduce-scatters the partial sums back to this
rank's tokens. docs/parallelism.md has the shapes per rank.

Every rank also builds the full model (no tensor parallelism) from the same seed and trains it
on the full batch; the parallel model starts from slices of the same weights. Two rules keep
them equal, and a real tensor-parallel training loop needs them too:
  * LayerNorm's weight and bias are replicated but see only this rank's tokens: their
    gradients are summed over the ranks before the optimizer step.
  * fc2's bias follows TransformerEngine's row-parallel convention: every rank holds a
    full-size bias that is added before the reduction, so the layer's bias is the SUM of the
    ranks' biases, and every rank gets the full gradient. Each rank's bias starts at
    b / world and takes Adam steps of lr / world, so the sum takes the full model's steps.

    torchrun --nproc-per-node 2 examples/train_tensor_parallel.py [--steps 10] [--compile]
    python examples/train_tensor_parallel.py     # one process: tensor parallelism turns off

gloo on CPU; NCCL with cuda:LOCAL_RANK when CUDA is available (--backend overrides).
"""

from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.distributed as dist

import transformer_engine_cpp as te

RTOL = 1e-5  # fp32: |TP loss - single-process loss| <= RTOL * single-process loss


def mlp_block(hidden: int, ffn: int, device: torch.device, parallel: bool) -> te.ops.Sequential:
    """The residual block; ``parallel``: fc1 column- and fc2 row-parallel, with sequence
    parallelism (a world of one rank turns both off)."""
    return te.ops.Sequential(
        te.ops.MakeExtraOutput().set_extra_output_channel(0, "residual", output_to_caller=False),
        te.ops.LayerNorm(hidden, device=device),
        te.ops.Linear(hidden, ffn, device=device, sequence_parallel=parallel,
                      tensor_parallel_mode="column" if parallel else None),
        te.ops.GELU(),
        te.ops.Linear(ffn, hidden, device=device, sequence_parallel=parallel,
                      tensor_parallel_mode="row" if parallel else None),
        te.ops.AddExtraInput().set_extra_input_channel(0, "residual"),
    )


def full_weights(hidden: int, ffn: int) -> dict:
    """The full-size initial weights, the same on every rank (seeded)."""
    g = torch.Generator().manual_seed(0)
    def randn(*shape, scale):
        return scale * torch.randn(*shape, generator=g)
    return {"ln_w": 1 + randn(hidden, scale=0.1), "ln_b": randn(hidden, scale=0.1),
            "w1": randn(ffn, hidden, scale=hidden ** -0.5), "b1": randn(ffn, scale=0.1),
            "w2": randn(hidden, ffn, scale=ffn ** -0.5), "b2": randn(hidden, scale=0.1)}


def print_in_rank_order(text: str) -> None:
    """Each rank's line in turn, so that the ranks' lines do not interleave."""
    for r in range(dist.get_world_size()):
        if r == dist.get_rank():
            print(text, flush=True)
        dist.barrier()


@torch.no_grad()
def load(block: te.ops.Sequential, w: dict, rank: int, world: int) -> None:
    """Copies the full weights into ``block``, or this rank's slices of them: fc1's rows (its
    output features) and bias, fc2's columns (its input features), fc2's bias / world."""
    f = w["w1"].shape[0] // world  # ffn features per rank
    cols = slice(rank * f, (rank + 1) * f)
    ln, fc1, fc2 = block[1], block[2], block[4]
    ln.weight.copy_(w["ln_w"])
    ln.bias.copy_(w["ln_b"])
    fc1.weight.copy_(w["w1"][cols])
    fc1.bias.copy_(w["b1"][cols])
    fc2.weight.copy_(w["w2"][:, cols])
    fc2.bias.copy_(w["b2"] / world)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per batch, all ranks")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--ffn", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--compile", action="store_true",
                        help="run the parallel block under torch.compile(fullgraph=True)")
    parser.add_argument("--backend", choices=("gloo", "nccl"),
                        default="nccl" if torch.cuda.is_available() else "gloo")
    args = parser.parse_args()

    timeout = datetime.timedelta(seconds=300)  # a failed peer ends the run instead of a hang
    if "RANK" in os.environ:  # torchrun
        dist.init_process_group(args.backend, timeout=timeout)
    else:  # plain python: a world of one
        dist.init_process_group(args.backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if args.tokens % world or args.ffn % world:
        raise SystemExit(f"--tokens {args.tokens} and --ffn {args.ffn} must be multiples of "
                         f"the world size {world}")

    weights = full_weights(args.hidden, args.ffn)
    tp_block = mlp_block(args.hidden, args.ffn, device, parallel=True)
    full_block = mlp_block(args.hidden, args.ffn, device, parallel=False)
    load(tp_block, weights, rank, world)
    load(full_block, weights, 0, 1)
    tp_model = torch.compile(tp_block, fullgraph=True) if args.compile else tp_block
    ln, fc2_bias = tp_block[1], tp_block[4].bias
    other = [p for p in tp_block.parameters() if p is not fc2_bias]
    tp_opt = torch.optim.Adam([{"params": other},
                               {"params": [fc2_bias], "lr": args.lr / world}], lr=args.lr)
    full_opt = torch.optim.Adam(full_block.parameters(), lr=args.lr)

    if rank == 0:
        print(f"world {world}, backend {args.backend}, device {device.type}, "
              f"{'torch.compile(fullgraph=True)' if args.compile else 'eager'}; "
              f"tokens {args.tokens}, hidden {args.hidden}, ffn {args.ffn}")
        print(f"per rank: x {[args.tokens // world, args.hidden]}, "
              f"fc1.weight {list(tp_block[2].weight.shape)}, "
              f"fc2.weight {list(tp_block[4].weight.shape)}, fc2.bias {list(fc2_bias.shape)}",
              flush=True)

    data = torch.Generator().manual_seed(1)  # the same batches on every rank
    rows = slice(rank * args.tokens // world, (rank + 1) * args.tokens // world)
    max_rel = 0.0
    for step in range(1, args.steps + 1):
        x = torch.randn(args.tokens, args.hidden, generator=data).to(device)
        y = torch.sin(2 * x).roll(1, dims=-1)  # the regression target

        # the single-process reference: the full batch
        full_opt.zero_grad()
        full_loss = torch.nn.functional.mse_loss(full_block(x), y)
        full_loss.backward()
        full_opt.step()

        # tensor + sequence parallel: this rank's tokens; the loss is the sum over the ranks
        tp_opt.zero_grad()
        out = tp_model(x[rows])
        loss = ((out - y[rows]) ** 2).sum() / y.numel()
        loss.backward()
        for p in ln.parameters():  # replicated, fed by this rank's tokens only
            dist.all_reduce(p.grad)
        tp_opt.step()
        loss = loss.detach()
        dist.all_reduce(loss)

        tp, ref = loss.item(), full_loss.item()
        rel = abs(tp - ref) / abs(ref)
        max_rel = max(max_rel, rel)
        print_in_rank_order(f"rank {rank} step {step:>2}: TP loss {tp:.7f}  "
                            f"single-process loss {ref:.7f}  rel. diff {rel:.1e}")

    verdict = "within" if max_rel <= RTOL else "BEYOND"
    print_in_rank_order(f"rank {rank}: max relative loss difference {max_rel:.1e}, {verdict} "
                        f"the fp32 tolerance {RTOL:.0e}")
    dist.destroy_process_group()
    if max_rel > RTOL:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
