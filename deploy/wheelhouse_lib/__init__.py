"""Offline wheelhouse for registry-less GPU hosts (see docs/gpu-host.md).

Modules: compat (third-party imports with pip's vendored fallback), hostenv (target platform,
markers, host package lists), policy (the checked-in decisions), resolve (dependency closure
minus the host), pipselect (pip-backed wheel selection and download), wheelfile (wheel
rewriting), pack (split into parts), output (manifest, report, install script).
"""
