"""``python -m lamina.bench``: performance benchmarks that print tables people read.

Subcommands:

    convnet   AlexNet-, VGG- and Inception-v1-like convnets: training and inference
              images/s, lamina beside PyTorch; --jit adds both compiled, with compile
              times and a training step's memory (lamina.tools.bench.convnet)
    distributed
              data-parallel training of an MLP and the convnets on 1 and 2 processes:
              images/s, scaling efficiency, overlap and all_reduce bandwidth, lamina
              beside PyTorch's DDP and mpi4py (lamina.tools.bench.distributed)
    jit       compiled functions (lamina.jit) beside eager lamina, PyTorch eager,
              torch.compile and NumPy: an elementwise chain, the cost of a compiled
              call, an MLP training step and compile times (lamina.tools.bench.jit)
    models    ResNet-18, MobileNet v2 and a Transformer encoder: training and
              inference items/s, lamina beside PyTorch (lamina.tools.bench.models)
    nn        convolution, pooling, LRN, batch norm and activation primitives on
              AlexNet/VGG/Inception-v1 shapes (16x64x56x56 float32), and those the
              models add at their sizes, lamina beside PyTorch (lamina.tools.bench.nn)
    ops       every elementwise, reduction, scan, sorting and nn-function operator at
              10^2, 10^4 and 10^6 elements and 1 and 2 threads, lamina beside PyTorch
              and NumPy (lamina.tools.bench.ops)

Every benchmark times lamina and its peers interleaved round by round and reports
medians, so a shared, noisy machine slows both sides alike; each library runs in a
process of its own (their thread pools would compete in one; ``--in-process`` times
them in this one), driven by lamina.tools.bench.timing. Without PyTorch lamina is
timed alone. ``--plot FILE.png`` draws the results (matplotlib, from the bench extra:
pip install 'lamina[bench]').
"""

from __future__ import annotations

import argparse

from . import convnet, distributed, jit, models, nn, ops


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lamina.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    subcommands = {
        "convnet": convnet,
        "distributed": distributed,
        "jit": jit,
        "models": models,
        "nn": nn,
        "ops": ops,
    }
    for name, module in subcommands.items():
        module.add_arguments(
            commands.add_parser(
                name,
                help=module.__doc__.splitlines()[0],
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    args = parser.parse_args(argv)
    subcommands[args.command].run(args)
