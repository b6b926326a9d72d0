"""Export a ResNet backbone checkpoint as a torchvision or timm state dict (.pth or .safetensors).

Any layout of docs/checkpoints.md; the output loads strictly into torchvision's ResNet (fc
dropped) or timm's (num_classes=0):

    python tools/export_backbone.py output/demo/model_final.pth output/demo/resnet18.pth
    python tools/export_backbone.py CKPT resnet50.safetensors --safetensors --format timm
"""

from __future__ import annotations

from pretrain.cli.arguments import ToolParser
from pretrain.cli.user_errors import exit_on_user_error
from transfer.export.backbone import EXPORT_FORMATS, export_backbone

__all__ = ["main"]


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    parser = ToolParser(description=__doc__.splitlines()[0])
    parser.add_argument("input", help="checkpoint to read (.pth/.pth.tar/.ckpt/.pkl/.safetensors)")
    parser.add_argument(
        "output",
        help="file to write: a torch pickle of the state dict (its metadata in OUTPUT.json), or "
        "with --safetensors a .safetensors file (metadata inside)",
    )
    parser.add_argument(
        "--format",
        choices=EXPORT_FORMATS,
        default="torchvision",
        help="the library whose ResNet the names are for (default torchvision; timm's ResNet "
        "names are the same, and the file is checked against timm's model)",
    )
    parser.add_argument(
        "--safetensors", action="store_true", help="write a .safetensors file (no pickle)"
    )
    args = parser.parse_args(argv)
    report = export_backbone(args.input, args.output, args.format, safetensors=args.safetensors)
    print(f"read {report.input_path}: {report.layout} layout, {report.arch}")
    if report.dropped:
        print(f"dropped {len(report.dropped)} keys on purpose (not part of the backbone)")
    print(
        f"wrote {report.num_tensors} tensors ({report.format} {report.arch}, fc dropped) to "
        f"{report.output_path}"
    )
    meta = ", ".join(f"{k}={v}" for k, v in report.metadata.items())
    print(f"metadata ({report.metadata_path}): {meta}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
