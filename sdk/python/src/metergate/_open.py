"""What makes the generated models (models.py) read a newer admit's replies: their string
enums are OpenEnums (scripts/templates/Enum.jinja2), and every model takes fields it does
not declare (datamodel-code-generator's --extra-fields allow)."""

from __future__ import annotations

from enum import Enum


class OpenEnum(str, Enum):
    """A string enum that also holds a value this SDK does not know yet (one a newer admit
    added): the value decodes to a member of its own, equal to its string, instead of
    failing the whole reply."""

    @classmethod
    def _missing_(cls, value: object) -> OpenEnum | None:
        if not isinstance(value, str):
            return None
        member = str.__new__(cls, value)
        member._name_ = value
        member._value_ = value
        return member
