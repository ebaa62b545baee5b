"""Types whose validation matches their JSON schema exactly, so that an API's OpenAPI document
is what it accepts (the fuzz test holds every API to that).

JSON Schema's ``integer`` includes ``3.0``; pydantic's strict ``int`` refuses it. ``Integral``
takes an integral float within the exactly representable range (2^53) as the int it is and leaves
everything else (``3.5``, ``"3"``, ``true``) to the strict check, which refuses it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BeforeValidator

EXACT_FLOAT_INT = 1 << 53


def integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= EXACT_FLOAT_INT:
        return int(value)
    return value


# Put it after the Field(...) constraints in an Annotated type: placed before them, pydantic would
# leave the bounds out of the JSON schema.
Integral = BeforeValidator(integral)
