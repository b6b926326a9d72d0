"""Convert a ResNet-50 (or 18/34/101/152) backbone checkpoint into a detectron2 weights file.

Any layout of docs/checkpoints.md; heads, key encoders and queues are dropped on purpose. The
output (.pkl or .pth) loads into every detection and segmentation config of configs/ (FPN, C4 and
DeepLab alike: the names are renamed to the model's layout when it is loaded) by exact names:

    python tools/convert_to_d2.py output/pretrain/model_final.pth pretrained/lorac_r50.pkl
"""

from __future__ import annotations

from pretrain.cli.arguments import ToolParser
from pretrain.cli.user_errors import exit_on_user_error
from transfer.detection.convert import FPN_PREFIX, ConversionError, convert_checkpoint

__all__ = ["main"]


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="checkpoint to read (.pth/.pth.tar/.pt)")
    parser.add_argument("output", help="detectron2 weights file to write (.pkl or .pth)")
    parser.add_argument(
        "--prefix",
        default=FPN_PREFIX,
        help=f"name prefix of the ResNet inside the detectron2 model (default {FPN_PREFIX!r}: "
        "tools/train_net.py renames it for the FPN, C4 and DeepLab models of configs/)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="list every key dropped on purpose (by default: how many, and a few names)",
    )
    args = parser.parse_args(argv)
    try:
        report = convert_checkpoint(args.input, args.output, prefix=args.prefix)
    except OSError as e:  # an output path that cannot be written
        raise ConversionError(str(e)) from e
    print(f"read {report.input_path}: {report.source_format} layout, {report.arch}")
    dropped = report.dropped
    if dropped:  # heads, key encoders, queues: hundreds of keys in a MoCo-style checkpoint
        shown = dropped if args.verbose else dropped[:_SHOWN]
        more = "" if len(shown) == len(dropped) else ", ... (all of them with --verbose)"
        print(
            f"dropped {len(dropped)} keys on purpose (not part of the backbone): "
            f"{', '.join(shown)}{more}"
        )
    print(
        f"wrote {report.num_converted} tensors as {report.prefix}* to {report.output_path} "
        "(tools/train_net.py loads it into FPN, C4 and DeepLab models alike)"
    )
    return 0


_SHOWN = 5  # dropped keys named without --verbose


if __name__ == "__main__":
    raise SystemExit(main())
