"""The kinds of run the Store records: a registry that a plug-in adds its kind to
(``register_run_kind``, or the ``proftune.run_kinds`` entry point group)."""

from __future__ import annotations

from .._registry import LiveSequence, Registry
from ..exceptions import ConfigError

__all__ = ["RUN_KINDS", "RUN_KIND_REGISTRY", "register_run_kind"]


#: The kinds of run the Store records, by name; a plug-in records a kind of its own after
#: ``register_run_kind`` (or an entry point of ``proftune.run_kinds`` naming its description).
RUN_KIND_REGISTRY: Registry[str] = Registry("run kind", entry_points="proftune.run_kinds")


#: The valid kinds, read from the registry on each use.
RUN_KINDS = LiveSequence(lambda: RUN_KIND_REGISTRY.names())


def register_run_kind(name: str, description: str = "") -> str:
    """Make ``name`` a kind of run the Store records (and ``runs list --kind`` filters by); ``name``
    is lower-case letters, digits and ``_``, at most 32 characters (the column's width); a kind
    registered already stays as it is."""
    if not isinstance(name, str) or not name or len(name) > 32 or not all(
            c.islower() or c.isdigit() or c == "_" for c in name) or not name[0].isalpha():
        raise ConfigError(f"run kind={name!r} must be 1 to 32 lower-case letters, digits or '_', "
                          "starting with a letter.")
    if not isinstance(description, str):
        raise ConfigError(f"description={description!r} must be a string.")
    if name not in RUN_KIND_REGISTRY.names_so_far():  # a kind is its name: registering it again is a no-op
        RUN_KIND_REGISTRY.add(description, name=name)
    return name
