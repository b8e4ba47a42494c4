"""Small value types used across contracts: identifiers, object-store references, and the bases
of every contract (`Contract`) and of those a user writes (`InputContract`)."""

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

MAX_ID = 128
"""The longest `Identifier`."""

Identifier = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_ID, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"),
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


def describe_validation_error(
    error: ValidationError, note: Callable[[ErrorDetails], str] | None = None
) -> str:
    """One line naming every field at fault: `task.entry_point: String should match …; …`,
    each followed by what `note` adds about it (a key meant, where a value came from)."""
    return "; ".join(
        f"{'.'.join(str(part) for part in e['loc']) or '<input>'}: {e['msg']}"
        + (note(e) if note is not None else "")
        for e in error.errors()
    )


class Contract(BaseModel):
    """Base of every contract: unknown fields are an error, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class InputContract(Contract):
    """Base of a contract whose values a user writes (a run's input and what it holds, a task's
    input): NaN and infinity are refused by name ("Input should be a finite number"), where a
    bound said `temperature = nan` "should be less than or equal to 2" and a field bounded on
    one side took `inf`. Results are not inputs and keep NaN: a row vLLM gave no log-prob for
    is recorded with NaN (`CompletionRecord.logprobs`), which this would refuse."""

    model_config = ConfigDict(allow_inf_nan=False)


class ObjectRef(Contract):
    """A reference to one object in the store; payloads carry these, never the bytes."""

    key: str = Field(min_length=1, description="Object key inside the configured bucket.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex digest of the content.")
