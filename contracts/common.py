"""Small value types used across contracts: identifiers and object-store references."""

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"),
]
"""An id that is safe inside an S3 key and a Temporal workflow id: letters, digits, `_ . -`."""


class Contract(BaseModel):
    """Base of every contract: unknown fields are an error, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class ObjectRef(Contract):
    """A reference to one object in the store; payloads carry these, never the bytes."""

    key: str = Field(min_length=1, description="Object key inside the configured bucket.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex digest of the content.")
