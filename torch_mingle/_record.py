"""Value classes that cost one compile each when their module is imported.

``@record`` is ``@dataclass(frozen=True)``, and ``@record(frozen=False)`` is ``@dataclass``, for
the part of dataclasses this package uses: fields with defaults, ``field(default_factory=...)``,
``field(compare=False)`` and ``field(repr=False)``, which generate ``__init__``, ``__repr__``,
``__eq__`` and, for frozen classes, ``__hash__``; ``replace`` and ``field_names`` stand in for
``dataclasses.replace`` and ``dataclasses.fields``.

Why not dataclasses: Python 3.11 compiles each generated method on its own and matches every
string annotation against regular expressions. For this package's fifty classes that was 35 ms
of the 43 ms that importing the handler took, in every torchrun agent before its rendezvous
could start (CHANGELOG.md). Here one ``exec`` per class makes its ``__init__``; the other
methods are shared by all records and compare or hash a tuple built by ``operator.attrgetter``.
"""

from __future__ import annotations

import inspect
import operator
import sys
from collections.abc import Callable
from dataclasses import MISSING, Field, FrozenInstanceError, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

if TYPE_CHECKING or sys.version_info >= (3, 11):
    from typing import assert_never, dataclass_transform
else:  # Python 3.10: the decorator only informs type checkers

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda f: f

    def assert_never(value: Any) -> Any:  # a ``match`` over records that missed one
        raise AssertionError(f"unhandled {type(value).__name__}: {value!r}")


__all__ = ["assert_never", "field", "field_names", "record", "replace"]

T = TypeVar("T")

_FIELDS = "__record_fields__"
_KEY = "__record_key__"  # a function: instance -> tuple of the fields that __eq__ compares
_SHOWN = "__record_shown__"  # the fields that __repr__ shows
_FACTORY = object()  # default of an __init__ parameter whose field has a default_factory
# Field attributes this module implements; anything else set on a field() is refused.
_PLAIN_FIELD = field()


def _frozen_setattr(self: object, name: str, value: object) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")


def _frozen_delattr(self: object, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")


def _key_of(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    if len(names) > 1:
        key: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*names)
        return key
    if names:
        get = operator.attrgetter(names[0])
        return lambda obj: (get(obj),)
    return lambda obj: ()


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = getattr(self, _KEY)
    return key(self) == key(other)


def _hash(self: Any) -> int:
    return hash(getattr(self, _KEY)(self))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in getattr(self, _SHOWN))
    return f"{type(self).__qualname__}({shown})"


def _is_classvar(annotation: object) -> bool:
    if isinstance(annotation, str):  # postponed annotations: the text as written
        return annotation.startswith(("ClassVar", "typing.ClassVar"))
    return annotation is ClassVar or getattr(annotation, "__origin__", None) is ClassVar


def _check_field(cls: type, name: str, f: Field[Any]) -> None:
    for attr in ("init", "hash", "metadata", "kw_only"):
        if getattr(f, attr) != getattr(_PLAIN_FIELD, attr):
            raise TypeError(f"{cls.__qualname__}.{name}: field({attr}=...) is not supported by @record")


def _build(cls: type[T], frozen: bool) -> type[T]:
    names: list[str] = []
    params: list[str] = []
    sets: list[str] = []
    compared: list[str] = []
    shown: list[str] = []
    scope: dict[str, Any] = {"_FACTORY": _FACTORY, "_set": object.__setattr__}
    for name, annotation in inspect.get_annotations(cls).items():
        if _is_classvar(annotation):
            continue
        value = cls.__dict__.get(name, MISSING)
        f = value if isinstance(value, Field) else field(default=value)
        _check_field(cls, name, f)
        names.append(name)
        compared += [name] if f.compare else []
        shown += [name] if f.repr else []
        if f.default_factory is not MISSING:
            scope[f"_factory_{name}"] = f.default_factory
            params.append(f"{name}=_FACTORY")
            expr = f"_factory_{name}() if {name} is _FACTORY else {name}"
            if isinstance(value, Field):
                delattr(cls, name)
        elif f.default is not MISSING:
            scope[f"_default_{name}"] = f.default
            params.append(f"{name}=_default_{name}")
            expr = name
            setattr(cls, name, f.default)
        else:
            if params and "=" in params[-1]:
                raise TypeError(f"{cls.__qualname__}: non-default field {name!r} follows a default one")
            params.append(name)
            expr = name
        sets.append(f"    _set(self, {name!r}, {expr})" if frozen else f"    self.{name} = {expr}")
    init = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(sets or ["    pass"])
    methods: dict[str, Any] = {}
    exec(init, scope, methods)  # noqa: S102 - the source is built above from field names only
    methods["__init__"].__qualname__ = f"{cls.__qualname__}.__init__"
    members: dict[str, Any] = {
        "__init__": methods["__init__"],
        "__repr__": _repr,
        "__eq__": _eq,
        "__hash__": _hash if frozen else None,  # like dataclasses: a mutable record is unhashable
        "__match_args__": tuple(names),
        _FIELDS: tuple(names),
        _KEY: staticmethod(_key_of(compared)),
        _SHOWN: tuple(shown),
    }
    if frozen:
        members.update(__setattr__=_frozen_setattr, __delattr__=_frozen_delattr)
    for member, value in members.items():
        setattr(cls, member, value)
    return cls


@overload
def record(cls: type[T], /) -> type[T]: ...


@overload
def record(*, frozen: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls: type[T] | None = None, /, *, frozen: bool = True) -> Any:
    """``@dataclass(frozen=True)``, or with ``frozen=False`` ``@dataclass``; see the module."""
    if cls is None:
        return lambda c: _build(c, frozen)
    return _build(cls, frozen)


def field_names(cls_or_obj: Any) -> tuple[str, ...]:
    """The fields of a record class or instance, in order."""
    names: tuple[str, ...] = getattr(cls_or_obj, _FIELDS)
    return names


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of record ``obj`` with ``changes`` (``dataclasses.replace``)."""
    unknown = set(changes) - set(field_names(obj))
    if unknown:
        raise TypeError(f"{type(obj).__qualname__} has no field(s) {', '.join(sorted(unknown))}")
    return type(obj)(**{**{n: getattr(obj, n) for n in field_names(obj)}, **changes})
