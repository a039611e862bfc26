"""@record behaves as the dataclasses it replaces, for the features the package uses."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from torch_mingle._record import field, field_names, record, replace


@record
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)
    note: str = field(default="", compare=False, repr=False)
    UNIT: ClassVar[str] = "m"


@record(frozen=False)
class Tally:
    n: int = 0
    seen: set[int] = field(default_factory=set)


@record
class Empty:
    pass


def test_a_frozen_record_has_the_dataclass_methods():
    p = Point(1, tags=("a",), note="hidden")
    assert (p.x, p.y, p.tags, p.note) == (1, 0, ("a",), "hidden")
    assert repr(p) == "Point(x=1, y=0, tags=('a',))"
    assert p == Point(1, 0, ("a",), note="other")  # compare=False leaves note out
    assert p != Point(2)
    assert p != (1, 0, ("a",))  # type: ignore[comparison-overlap] # another class never compares equal
    assert hash(p) == hash(Point(1, 0, ("a",)))
    assert {p, Point(1, 0, ("a",))} == {p}
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del p.x
    assert field_names(Point) == ("x", "y", "tags", "note")
    assert Point.UNIT == "m"
    assert Point.y == 0  # a plain default stays a class attribute, as with dataclasses
    assert Empty() == Empty()
    assert repr(Empty()) == "Empty()"


def test_a_mutable_record_gets_a_fresh_default_per_instance_and_no_hash():
    a, b = Tally(), Tally()
    a.seen.add(1)
    a.n += 1
    assert b.seen == set()
    assert a == Tally(1, {1})
    with pytest.raises(TypeError, match="unhashable"):
        hash(a)


def test_replace_copies_with_changes_and_refuses_unknown_fields():
    p = Point(1, 2, note="kept")
    q = replace(p, y=5)
    assert (q.x, q.y, q.note) == (1, 5, "kept")
    with pytest.raises(TypeError, match="no field"):
        replace(p, z=1)


def test_positional_patterns_match_fields_in_order():
    match Point(3, 4):
        case Point(x, y):
            assert (x, y) == (3, 4)
        case _:
            pytest.fail("Point(3, 4) did not match Point(x, y)")


def test_definitions_dataclasses_would_refuse_are_refused_and_unsupported_options_named():
    with pytest.raises(TypeError, match="non-default field 'b' follows a default one"):

        @record
        class Bad:
            a: int = 0
            b: int  # type: ignore[misc]

    with pytest.raises(TypeError, match=r"field\(init=...\) is not supported"):

        @record
        class NoInit:
            a: int = field(default=0, init=False)
