"""Interface selection: by name or address, and errors that list what exists."""

from __future__ import annotations

import socket

import pytest

from torch_mingle._interfaces import choose_interface, list_interfaces
from torch_mingle.errors import MingleConfigError


def test_loopback_by_address_and_by_name():
    by_addr, why = choose_interface("127.0.0.1", socket.AF_INET)
    assert by_addr.loopback and by_addr.address == "127.0.0.1"
    assert why.startswith("pinned by the interface key")
    by_name, _ = choose_interface(by_addr.name, socket.AF_INET)
    assert by_name.name == by_addr.name


def test_unknown_interface_lists_the_real_ones():
    with pytest.raises(MingleConfigError) as err:
        choose_interface("nosuch0", socket.AF_INET)
    message = str(err.value)
    assert "interface='nosuch0' matches no interface" in message
    assert "127.0.0.1" in message  # the listing shows what exists
    assert "fix: --rdzv_conf interface=" in message


def test_local_addr_picks_the_interface_that_holds_it():
    iface, why = choose_interface(None, socket.AF_INET, local_addr="127.0.0.1")
    assert iface.loopback
    assert "local-addr" in why


def test_automatic_choice_prefers_a_real_interface_and_says_why():
    ifaces = list_interfaces(socket.AF_INET)
    iface, why = choose_interface(None, socket.AF_INET)
    assert iface in ifaces
    if any(i.up and not i.loopback and i.addresses and i.multicast for i in ifaces):
        assert not iface.loopback
    assert why


def test_an_address_of_the_other_family_is_named_as_such_not_as_missing():
    with pytest.raises(MingleConfigError) as err:
        choose_interface("127.0.0.1", socket.AF_INET6)
    said = str(err.value)
    assert "is an IPv4 address" in said and "but the group is IPv6" in said, said
    assert "matches no interface" not in said
