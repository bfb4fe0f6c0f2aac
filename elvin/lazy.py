"""Package attributes imported on first use (PEP 562), so importing a
package stays cheap and its modules can use each other without cycles."""

import importlib

__all__ = ["lazy_attributes"]


def lazy_attributes(package, table):
    """A module ``__getattr__`` for ``package`` resolving ``table``'s names
    (name -> module that defines it) when first asked for."""
    def __getattr__(name):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)
    return __getattr__
