"""sglang.sm120.upstream_api.resolved reads each resolved setting where the installed base keeps
it: 0.5.23's published namespace bags (get_exec()), 0.5.16's ServerArgs record. Runs against the
installed fork (see test_installed.py)."""
import subprocess
import sys
import textwrap

from installed import skip_module_without_sglang  # noqa: E402

skip_module_without_sglang()

SCRIPT = textwrap.dedent(
    """
    from types import SimpleNamespace
    from sglang.sm120 import upstream_api
    from sglang.srt.runtime_context import get_context

    base = upstream_api.check_installed()
    fields = ("enable_deterministic_inference", "enable_fused_moe_sum_all_reduce")
    if base == "0.5.23":
        ctx = get_context()
        for on in (True, False):
            with ctx.override_server_args(**{f: on for f in fields}):
                assert [upstream_api.resolved(f) for f in fields] == [on, on]
        # a value changed after publishing reaches the bag, not the record: resolved() sees it
        with ctx.override_server_args():
            from sglang.srt.runtime_context import get_exec
            with get_exec().moe.override(enable_fused_moe_sum_all_reduce=True):
                assert upstream_api.resolved("enable_fused_moe_sum_all_reduce") is True
                assert ctx.server_args.enable_fused_moe_sum_all_reduce is False  # what lean_moe read
    else:
        ctx = get_context()
        for on in (True, False):
            ctx.set_server_args(SimpleNamespace(**{f: on for f in fields}))
            assert [upstream_api.resolved(f) for f in fields] == [on, on]
    print("RESOLVED-OK", base)
    """
)


def test_resolved_reads_where_the_installed_base_keeps_the_value():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, cwd="/")
    assert proc.returncode == 0 and "RESOLVED-OK" in proc.stdout, proc.stderr[-3000:]
