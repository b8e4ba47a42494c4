"""Small value types used across contracts: identifiers, object-store references, and the bases
of every contract (`Contract`), of those a signal carries (`SignalPayload`) and of those a user
writes (`InputContract`)."""

from collections.abc import Callable
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
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


class SignalPayload(Contract):
    """Base of a contract a signal carries (and of what it holds: `LearnerDone.final` is a
    learner's whole state): fields this build does not know are ignored, at every depth, where
    other contracts refuse them. A training run and its learner run on different builds until
    each has continued as new onto the current one (worker versioning pins the other), and the
    SDK drops, with a log line only, a signal whose payload fails to decode: a newer learner's
    `learner_progress` or `learner_done` was lost on an older run, which then waited for ever.
    A field a build adds to a signal needs a default (an older sender leaves it out) and is
    lost on an older receiver. Workflow inputs and activity requests keep refusing unknown
    fields, so that a typo is an error: a workflow's input comes from its own build or an
    earlier one, and activity contracts change additively (README, "Safe upgrades")."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="wrap")
    @classmethod
    def _ignore_unknown_fields(
        cls, value: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        # `extra` above holds for this object only: its nested contracts (another build's
        # `GRPOConfig` in `LearnerDone.final`) are validated first with unknown fields ignored,
        # then handed to `handler` as they are (it fills the instance `__init__` builds)
        if isinstance(value, dict) and info.context is not _IGNORING:
            known = cls.__pydantic_validator__.validate_python(
                value, extra="ignore", context=_IGNORING
            )
            value = {name: getattr(known, name) for name in known.model_fields_set}
        return handler(value)


_IGNORING = object()
"""The validation context of a `SignalPayload` that ignores unknown fields at every depth."""


class InputContract(Contract):
    """Base of a contract whose values a user writes (a run's input and what it holds, a task's
    input): NaN and infinity are refused by name ("Input should be a finite number"), where a
    bound said `temperature = nan` "should be less than or equal to 2" and a field bounded on
    one side took `inf`. Results are not inputs: a sampled token's log-prob that is not finite
    is the engine's fault, which `CompletionRecord.logprobs` refuses as such (retried), not as a
    caller's bad value."""

    model_config = ConfigDict(allow_inf_nan=False)


class ObjectRef(Contract):
    """A reference to one object in the store; payloads carry these, never the bytes."""

    key: str = Field(min_length=1, description="Object key inside the configured bucket.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex digest of the content.")
