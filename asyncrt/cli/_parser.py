"""The command line's arguments."""

from __future__ import annotations

import argparse

from scheduler.placement import POLICY_NAMES

from .. import __version__
from ..tools._profile import SORT_KEYS

__all__ = ("build_parser",)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a duration >= 0")
    return value


class _Help(argparse.HelpFormatter):
    """Help that shows each option's default where it has one worth saying
    (not for flags, and not where the help already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or not action.option_strings
            or default is None
            or isinstance(default, bool)  # a flag: its help says what it does
            or default == []
            or default == argparse.SUPPRESS
        ):
            return text
        return f"{text} (default: %(default)s)"


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="TVM graph JSON, exported module (.zip) or ONNX file; "
        "default: the built-in example",
    )
    parser.add_argument(
        "--params", metavar="FILE", help="parameters of a graph JSON (TVM's format)"
    )
    parser.add_argument(
        "--device",
        action="append",
        metavar="DEV",
        help="a device to use (repeat, or comma separated; the first faces the "
        "host); default: every device present",
    )
    parser.add_argument(
        "--policy", choices=POLICY_NAMES, default="auto", help="placement policy"
    )
    parser.add_argument(
        "--streams",
        type=_positive,
        default=1,
        metavar="N",
        help="compute streams per device",
    )
    parser.add_argument(
        "--no-split",
        dest="split",
        action="store_false",
        help="keep every node whole (by default, with 2 or more streams, a "
        "large elementwise join runs in row blocks, one per cpu stream)",
    )
    parser.add_argument(
        "--fuse",
        choices=("auto", "on", "off"),
        default="auto",
        help="fuse chains of elementwise ops: where it pays and results stay "
        "bit for bit (auto), every chain (on) or none (off)",
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input's value (repeat); FILE.npz alone gives one input per "
        "array, by the arrays' names; inputs not given get seeded random data "
        "(integer indices within the table they index)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=1x3x224x224",
        help="an input's shape, for an ONNX model with symbolic dimensions "
        "(repeat); shapes also come from --input arrays, and a symbol given "
        "nowhere is taken as 1",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module (a dotted name, or a .py file) that registers "
        "kernels, before loading the model (repeat)",
    )


def _json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print JSON for machines, nothing else"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``asyncrt`` argument parser, one subcommand per job."""
    parser = argparse.ArgumentParser(
        prog="asyncrt",
        description="Run computation graphs across devices, and see what happens.",
        formatter_class=_Help,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        formatter_class=_Help,
        help="run a model (or the built-in example) and print its outputs",
    )
    _model_arguments(run)
    run.add_argument("--output", metavar="DIR", help="save the outputs as .npy here")
    run.add_argument(
        "--trace", metavar="FILE", help="write a Chrome trace / Perfetto timeline"
    )
    _json(run)

    devices = commands.add_parser(
        "devices", formatter_class=_Help, help="list devices and their attributes"
    )
    _json(devices)

    plan = commands.add_parser(
        "plan", formatter_class=_Help, help="show the plan of a model"
    )
    _model_arguments(plan)
    plan.add_argument(
        "--dot",
        metavar="FILE",
        help="draw the plan: .png/.svg/.pdf with graphviz, else .dot text",
    )
    _json(plan)

    profile = commands.add_parser(
        "profile", formatter_class=_Help, help="per-node times of a model"
    )
    _model_arguments(profile)
    profile.add_argument(
        "--runs", type=_positive, default=10, metavar="N", help="measured runs"
    )
    profile.add_argument(
        "--sort", choices=SORT_KEYS, default="time", help="order of the node table"
    )
    profile.add_argument(
        "--top", type=_positive, metavar="N", help="show only the first N nodes"
    )
    profile.add_argument(
        "--by",
        choices=("node", "op", "device"),
        default="node",
        help="the table --csv prints (op: by operator type, such as Conv)",
    )
    profile.add_argument("--csv", action="store_true", help="print CSV for machines")
    profile.add_argument("--trace", metavar="FILE", help="write the runs' timeline")
    profile.add_argument(
        "--gantt", metavar="FILE", help="draw the last run (.png; needs asyncrt[plot])"
    )
    profile.add_argument(
        "--dump", metavar="DIR", help="dump every node's output (TVM's layout)"
    )
    _json(profile)

    bench = commands.add_parser(
        "bench", formatter_class=_Help, help="time a model's runs"
    )
    _model_arguments(bench)
    bench.add_argument(
        "--number", type=_positive, default=5, metavar="N", help="runs per measurement"
    )
    bench.add_argument(
        "--repeat", type=_positive, default=5, metavar="N", help="measurements"
    )
    bench.add_argument(
        "--min-repeat-ms",
        type=_milliseconds,
        default=0.0,
        metavar="MS",
        help="grow --number until a measurement lasts this long",
    )
    bench.add_argument(
        "--end-to-end",
        action="store_true",
        help="count copying the inputs in and the outputs out",
    )
    bench.add_argument(
        "--sweep",
        action="append",
        default=[],
        metavar="SYMBOL=1,2,4",
        help="an ONNX model's symbolic dimension and the sizes to time it at "
        "(repeat: every combination runs); one executor serves them all, a "
        "plan per shape, and the plan cache's figures are shown",
    )
    _json(bench)
    return parser
