"""The examples in the package's docstrings run and print what they show."""

import doctest

import kvlayout
from kvlayout import _arrays


def test_package_docstring_examples():
    for module in (kvlayout, _arrays):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0, module.__name__
        assert result.failed == 0, module.__name__
