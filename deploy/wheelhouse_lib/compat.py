"""Third-party imports the wheelhouse needs, falling back to pip's vendored copies.

The tool must run on a bare interpreter that has only pip (pip is needed anyway), so
`packaging` and a TOML reader come from pip._vendor when they are not installed.
"""
try:
    from packaging.markers import Marker  # noqa: F401
    from packaging.requirements import InvalidRequirement, Requirement  # noqa: F401
    from packaging.specifiers import InvalidSpecifier, SpecifierSet  # noqa: F401
    from packaging.utils import canonicalize_name  # noqa: F401
    from packaging.version import InvalidVersion, Version  # noqa: F401
except ImportError:  # pragma: no cover - depends on the interpreter
    from pip._vendor.packaging.markers import Marker  # noqa: F401
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # noqa: F401
    from pip._vendor.packaging.specifiers import InvalidSpecifier, SpecifierSet  # noqa: F401
    from pip._vendor.packaging.utils import canonicalize_name  # noqa: F401
    from pip._vendor.packaging.version import InvalidVersion, Version  # noqa: F401

try:
    import tomllib  # noqa: F401
except ImportError:  # pragma: no cover - Python < 3.11
    from pip._vendor import tomli as tomllib  # noqa: F401
