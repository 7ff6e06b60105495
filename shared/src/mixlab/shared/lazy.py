"""Package exports that load on first use (PEP 562), so that CLIs answer ``--help`` without
importing torch, SciPy or scikit-learn."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, module_of: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: name ``n`` is imported from
    ``package + "." + module_of[n]`` when first used, then cached in the package.

    In the package's ``__init__.py``::

        __getattr__, __dir__ = lazy_exports(__name__, {"MoSAIC": "estimators", ...})
    """

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        try:
            module = importlib.import_module(f"{package}.{module_of[name]}")
        except ModuleNotFoundError as error:
            # a NumPy-only install (mixlab-online) has no torch: name what needs it
            if error.name is None or error.name.partition(".")[0] != "torch":
                raise
            raise ModuleNotFoundError(
                f"{package}.{name} needs torch, which is not installed here (pip install torch)",
                name=error.name,
            ) from error
        value = getattr(module, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(module_of)

    return __getattr__, __dir__
