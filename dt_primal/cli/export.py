"""``python -m dt_primal.cli.export CKPT OUT.onnx`` (installed as ``dt-primal-export``): a checkpoint's policy as
one ONNX file (``dt_primal.export``)."""

from __future__ import annotations

from pathlib import Path

from dt_primal import export as onnx_export
from dt_primal.cli import command_parser, run_main
from dt_primal.errors import UserError


def main(argv: list[str] | None = None, prog: str = "python -m dt_primal.cli.export") -> None:
    p = command_parser(onnx_export.__doc__, prog=prog)
    p.add_argument("checkpoint", help="a train.py checkpoint (last.pt)")
    p.add_argument("out", help="the ONNX file to write (.onnx)")
    args = p.parse_args(argv)

    def run():
        if Path(args.out).suffix != ".onnx":
            raise UserError(f"{args.out}: the policy is written as an .onnx file; name it so.")
        try:
            import onnx  # noqa: F401
            import onnxscript  # noqa: F401
        except ImportError as exc:
            raise UserError(f"Exporting needs onnx and onnxscript ({exc}): pip install onnx onnxscript.") from None
        path = onnx_export.export(args.checkpoint, args.out)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB)")

    run_main(run)


if __name__ == "__main__":
    main()
