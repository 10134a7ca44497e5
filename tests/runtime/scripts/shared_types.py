"""A class of the test programs' own, importable in their workers (the scripts' folder is on
``sys.path``): what an object of a user's class is to the collectives."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Point:
    """A user's object, pickled by reference to this class."""

    x: int
    tag: str
