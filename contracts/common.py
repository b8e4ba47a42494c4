"""Small value types used across contracts: identifiers and object-store references."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"),
]
"""An id that is safe inside an S3 key and a Temporal workflow id: letters, digits, `_ . -`."""

_IDENTIFIER: TypeAdapter[str] = TypeAdapter(Identifier)


def is_identifier(value: str) -> bool:
    """Whether `value` is a valid `Identifier` (for ids that arrive outside a contract)."""
    try:
        _IDENTIFIER.validate_python(value)
    except ValidationError:
        return False
    return True


def describe_validation_error(error: ValidationError) -> str:
    """One line naming every field at fault: `task.entry_point: String should match …; …`."""
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc']) or '<input>'}: {e['msg']}"
        for e in error.errors()
    )


class Contract(BaseModel):
    """Base of every contract: unknown fields are an error, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class ObjectRef(Contract):
    """A reference to one object in the store; payloads carry these, never the bytes."""

    key: str = Field(min_length=1, description="Object key inside the configured bucket.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex digest of the content.")
