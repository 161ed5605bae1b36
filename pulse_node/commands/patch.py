"""``pulse-node patch``: make, apply and inspect PULSESync patches between safetensors files.

    pulse-node patch diff OLD.safetensors NEW.safetensors -o PATCH [--mode overwrite|compact]
    pulse-node patch apply BASE.safetensors PATCH -o OUT.safetensors [--allow-any-base]
    pulse-node patch inspect PATCH [--json]

torch-free: files are read with ``codec.state``'s safetensors IO. Outputs are written
atomically, so a failed command never leaves a partial file behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("patch", help="make, apply and inspect weight patches (PULSESync)",
                              description="Lossless sparse BF16 weight patches between safetensors files.")
    sub = p.add_subparsers(dest="patch_command", metavar="ACTION", required=True)
    d = sub.add_parser("diff", help="write the patch that turns OLD into NEW")
    d.add_argument("old", type=Path, help="base version (safetensors)")
    d.add_argument("new", type=Path, help="new version (safetensors)")
    d.add_argument("-o", "--output", type=Path, required=True, help="patch file to write")
    d.add_argument("--mode", choices=("overwrite", "compact"), default="compact",
                   help="compact (default): smallest, exact base only; overwrite: idempotent new values")
    d.add_argument("--context", action="store_true",
                   help="compact: code positions with the base's exponent classes (~20%% smaller, slower apply)")
    a = sub.add_parser("apply", help="apply a patch to BASE and write the result")
    a.add_argument("base", type=Path, help="base version (safetensors)")
    a.add_argument("patch", type=Path, help="patch file")
    a.add_argument("-o", "--output", type=Path, required=True, help="safetensors file to write")
    a.add_argument("--allow-any-base", action="store_true",
                   help="overwrite patches only: apply even if BASE is not the patch's base version")
    i = sub.add_parser("inspect", help="print what a patch contains")
    i.add_argument("patch", type=Path, help="patch file")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def _read(path: Path) -> bytes:
    from pulse_node.errors import PatchError

    try:
        return path.read_bytes()
    except OSError as exc:
        raise PatchError(f"{path}: cannot read ({exc.strerror})") from None


def _diff(args: argparse.Namespace) -> int:
    from pulse_node.codec.patch import make_patch, patch_stats
    from pulse_node.codec.state import load_safetensors
    from pulse_node.fsutil import write_atomic

    patch = make_patch(load_safetensors(args.old), load_safetensors(args.new), mode=args.mode,
                       position_context=args.context)
    write_atomic(args.output, patch)
    s = patch_stats(patch)
    print(f"{args.output}: {s.mode} patch, {s.changed} changed elements ({s.density:.3%}), {s.bytes} bytes, "
          f"{s.bytes_per_changed:.3f} B/change, {s.ratio_vs_dense_bf16:.1f}x smaller than dense BF16")
    return 0


def _apply(args: argparse.Namespace) -> int:
    from pulse_node.codec.patch import apply_patch
    from pulse_node.codec.state import load_safetensors, save_safetensors_atomic
    from pulse_node.errors import PulseError

    patch = _read(args.patch)
    try:
        out = apply_patch(load_safetensors(args.base), patch, allow_any_base=args.allow_any_base)
    except PulseError as exc:
        raise type(exc)(f"{args.patch}: {exc}") from None
    save_safetensors_atomic(out, args.output)
    print(f"{args.output}: written ({len(out)} tensors)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from pulse_node.codec.patch import patch_stats, read_header
    from pulse_node.errors import PulseError

    data = _read(args.patch)
    try:
        header, stats = read_header(data), patch_stats(data)
    except PulseError as exc:
        raise type(exc)(f"{args.patch}: {exc}") from None
    info = dataclasses.asdict(stats) | {"base_state_hash": header.base_state_hash, "result_state_hash": header.result_state_hash,
                                        "format_version": header.version}
    if args.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    print(f"patch {args.patch} (format v{header.version}, {stats.mode} mode)")
    print(f"  base   {header.base_state_hash}\n  result {header.result_state_hash}")
    print(f"  tensors {stats.tensors} ({stats.changed_tensors} changed), elements {stats.numel}")
    print(f"  changed {stats.changed} ({stats.density:.4%}), bytes {stats.bytes}, "
          f"{stats.bytes_per_changed:.3f} B/change, {stats.ratio_vs_dense_bf16:.1f}x vs dense BF16")
    return 0


def run(args: argparse.Namespace) -> int:
    from pulse_node.codec.warmup import clear_stale_cache

    clear_stale_cache()  # before the first kernel loads from numba's on-disk cache
    actions = {"diff": _diff, "apply": _apply, "inspect": _inspect}
    return actions[args.patch_command](args)
