from __future__ import annotations

import ipybox


def test_the_public_surface_is_exactly_what_all_lists() -> None:
    exported = {name for name in dir(ipybox) if not name.startswith("_")}
    assert set(ipybox.__all__) == exported
    assert list(ipybox.__all__) == sorted(ipybox.__all__)
    assert isinstance(ipybox.__all__, tuple)


def test_every_exception_derives_from_ipybox_error() -> None:
    for name in ipybox.__all__:
        obj = getattr(ipybox, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, ipybox.IpyboxError), name
