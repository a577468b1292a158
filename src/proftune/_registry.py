"""One way to make a kind of part pluggable: a :class:`Registry` of named entries.

Built-in parts register exactly as a user's plug-in does, with the registry's decorator (or
:meth:`Registry.add`), or from an installed package through an entry point group
(``[project.entry-points."proftune.checks"]`` names an object to register). A string on the
command line is only a key of a registry; the lists that used to be kept in step by hand (the
valid choices of an option, the causes a check can name) are read from it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast, overload

from .exceptions import ConfigError

__all__ = ["LiveSequence", "Registry"]

T = TypeVar("T")
_loading = False  # some registry is importing its installed plug-ins now
E = TypeVar("E")
X = TypeVar("X")


class Registry(Mapping[str, T], Generic[T]):
    """Entries of one kind by name, in the order they were registered.

    ``kind`` names the kind in messages ("diagnosis check"); ``key`` reads an entry's name from the
    entry when the caller gives none; ``entry_points`` is the group of installed plug-ins, loaded
    once, on the first read.
    """

    def __init__(self, kind: str, *, key: Callable[[T], str] | None = None,
                 entry_points: str | None = None) -> None:
        self.kind = kind
        self._key = key
        self._group = entry_points
        self._loaded = entry_points is None
        self._entries: dict[str, T] = {}
        #: What each entry was registered from: the class a decorator built it of, else the entry.
        self._origins: dict[str, object] = {}
        self._registrar: Callable[..., object] | None = None
        self._registrar_named = False

    def add(self, entry: T, *, name: str | None = None, replace: bool = False,
            origin: object = None) -> T:
        """Register ``entry`` under ``name`` (or its own key); a taken name needs ``replace=True``.

        Registering the same object again (or an instance built again from the same ``origin``, the
        class a decorator was given) is a no-op, so a plug-in module that is both decorated and
        named by an entry point registers once; another object under a taken name is an error."""
        if name is None:
            if self._key is None:
                raise ConfigError(f"a {self.kind} needs a name: add(entry, name=...).")
            name = self._key(entry)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a {self.kind}'s name must be a non-empty string, but got {name!r}.")
        if name in self._entries and not replace:
            if self._entries[name] is entry or (origin is not None and self._origins.get(name) is origin):
                return self._entries[name]
            raise ConfigError(f"a {self.kind} named {name!r} is registered already "
                              f"({self._entries[name]!r}); pass replace=True to replace it.")
        self._entries[name] = entry
        self._origins[name] = entry if origin is None else origin
        return entry

    def register(self, entry: Any = None, /, *, name: str | None = None,
                 replace: bool = False) -> Any:
        """Decorator (``@REG.register`` or ``@REG.register(name=...)``) that registers a class or an
        object; a class is registered as one instance of it built with no arguments, so a plug-in
        class needs nothing else. Returns what it decorates, unchanged."""
        def deco(obj: Any) -> Any:
            self.add(obj() if isinstance(obj, type) else obj, name=name, replace=replace, origin=obj)
            return obj

        return deco(entry) if entry is not None else deco

    def add_named(self, entry: X, *, base: type, arg: str, public: str) -> X:
        """Register a ``base`` subclass (built with no arguments) or instance whose ``name`` is its
        key, checking both (``arg`` and ``public`` name them in the message); returns ``entry``, so
        a plug-in's ``register_*`` is this one call and usable as a class decorator."""
        obj: Any = entry() if isinstance(entry, type) else entry
        if not isinstance(obj, base):
            raise ConfigError(f"{arg}={entry!r} is not a {public}.")
        name = getattr(obj, "name", None)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{type(obj).__name__}.name must be a non-empty string, but got {name!r}.")
        self.add(cast(T, obj), name=name, origin=entry)
        return entry

    def loads_through(self, registrar: Callable[..., object], *, named: bool = False) -> None:
        """Route the installed plug-ins through ``registrar(obj)`` (the kind's ``register_*``; with
        ``named``, ``registrar(obj, entry_point_name)``), so an entry point passes the same checks
        as a call in Python does."""
        self._registrar, self._registrar_named = registrar, named

    def remove(self, name: str) -> T:
        """Unregister ``name`` (a plug-in's own tests put the registry back as it was)."""
        self._load()
        if name not in self._entries:
            raise ConfigError(self._unknown(name))
        self._origins.pop(name, None)
        return self._entries.pop(name)

    def get_entry(self, name: str) -> T:
        """The entry named ``name``, or a ConfigError listing every valid name."""
        self._load()
        if name not in self._entries:
            raise ConfigError(self._unknown(name))
        return self._entries[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        self._load()
        return tuple(self._entries)

    def names_so_far(self) -> tuple[str, ...]:
        """The names registered in this process so far, without loading the installed plug-ins
        (a command's ``--help`` text, built at import, must not import them)."""
        return tuple(self._entries)

    def _unknown(self, name: object) -> str:
        return f"{self.kind} {name!r} is unknown; valid: {', '.join(self._entries) or '(none)'}."

    def _load(self) -> None:
        global _loading
        if self._loaded or _loading:
            # While one registry imports a plug-in, that module's own decorators read registries (a
            # stage's ``after``): they see what is registered so far and load theirs on a later
            # read, rather than import the half-imported module again.
            return
        self._loaded = True
        _loading = True
        try:
            self._load_entry_points()
        finally:
            _loading = False

    def _load_entry_points(self) -> None:
        from importlib.metadata import entry_points

        for ep in entry_points(group=self._group or ""):
            where = f"the {self.kind} plug-in {ep.name!r} ({ep.value}) of entry point group {self._group!r}"
            try:
                obj = ep.load()
            except Exception as e:
                raise ConfigError(f"{where} failed to load: {type(e).__name__}: {e}") from e
            if self._registered(obj):  # its module registered it with the decorator as it loaded
                continue
            try:
                if self._registrar is not None:
                    self._registrar(*((obj, ep.name) if self._registrar_named else (obj,)))
                else:
                    self.add(obj() if isinstance(obj, type) else obj, name=None if self._key else ep.name,
                             origin=obj)
            except ConfigError as e:
                raise ConfigError(f"{where} is refused: {e}") from e

    def _registered(self, obj: object) -> bool:
        """``obj`` (an entry point's object) is registered already: itself, or built from it."""
        if any(obj is o for o in self._origins.values()) or any(obj is e for e in self._entries.values()):
            return True
        return isinstance(obj, type) and any(type(e) is obj for e in self._entries.values())

    # Mapping: every read loads the plug-ins first.
    def __getitem__(self, name: str) -> T:
        self._load()
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        self._load()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._load()
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"


class LiveSequence(Sequence[E]):
    """A read-only sequence computed from a registry on every read (``CHECKS``, ``CAUSES``): what
    a plug-in registers later is in it, and it equals the tuple it shows."""

    def __init__(self, read: Callable[[], tuple[E, ...]]) -> None:
        self._read = read

    @overload
    def __getitem__(self, i: int) -> E: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[E, ...]: ...

    def __getitem__(self, i: int | slice) -> E | tuple[E, ...]:
        return self._read()[i]

    def __len__(self) -> int:
        return len(self._read())

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(self._read())
