"""The ``asyncrt`` command line: run, inspect, profile and time models.

.. code-block:: console

    $ asyncrt run                      # the built-in example, every device
    $ asyncrt run model.json --params model.params --input x=x.npy --output out/
    $ asyncrt run model.onnx --shape x=1x3x224x224   # symbolic dimensions
    $ asyncrt run bert.onnx --input inputs.npz        # one array per input
    $ asyncrt plan deploy.json --import my_kernels    # kernels from a module
    $ asyncrt devices
    $ asyncrt plan model.onnx --dot plan.png
    $ asyncrt profile model.zip --runs 20 --sort time --trace trace.json
    $ asyncrt bench --repeat 10 --min-repeat-ms 100

Every command takes ``--json`` for machines. A bad file or argument is one
line on stderr and a non-zero exit code (2 for usage, 1 for the rest), never
a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from ..errors import AsyncrtError
from ._commands import COMMANDS
from ._console import Output
from ._parser import build_parser

__all__ = ("main",)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    :param argv: the arguments (default: ``sys.argv[1:]``).
    :return: the exit code.
    """
    args = build_parser().parse_args(argv)  # exits 2 on a usage error
    out = Output(json_mode=getattr(args, "json", False))
    try:
        return anyio.run(COMMANDS[args.command], args, out)
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130
    except AsyncrtError as exc:
        out.error(str(exc))
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        out.error(f"{where}{exc.strerror or exc}")
        return 1
