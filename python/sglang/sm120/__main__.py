"""python -m sglang.sm120 {info,check,plan}"""
import argparse
import json
import sys

from sglang.sm120.build_info import build_info


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["check"]:  # its own options: sglang.sm120.check.cli
        from sglang.sm120.check.cli import main as check_main

        return check_main(argv[1:])
    if argv[:1] == ["plan"]:  # its own options, the rest are server flags: sglang.sm120.plan.cli
        from sglang.sm120.plan.cli import main as plan_main

        return plan_main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m sglang.sm120", description="sglang-sm120 fork tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="print the upstream base (version, what it is verified on), applied series and built kernels as JSON")
    sub.add_parser("check", help="validate the fork on this GPU (correctness, layerwise graphs, speed); "
                                 "see `python -m sglang.sm120 check --help`")
    sub.add_parser("plan", help="what upstream alone and the fork would capture on a card, no GPU needed; "
                                "see `python -m sglang.sm120 plan --help`")
    ap.parse_args(argv)
    info = build_info()
    if info.get("version"):
        from sglang.sm120 import upstream_api

        try:
            info["anchors"] = f"all upstream anchors of base {upstream_api.check_installed()} present"
        except upstream_api.UpstreamAnchorError as e:
            info["anchors"] = f"ERROR: {e}"
    print(json.dumps(info, indent=2))
    return 0 if info.get("version") and not info["anchors"].startswith("ERROR") else 1


if __name__ == "__main__":
    sys.exit(main())
