class BuildError(Exception):
    """A build failure the user can act on; its message is printed as one line."""


def log(msg: str) -> None:
    import sys

    print(f"[sglang-sm120] {msg}", file=sys.stderr, flush=True)
