"""Small value types used across contracts: identifiers, object-store references, and the bases
of every contract (`Contract`), of those a signal carries (`SignalPayload`) and of those a user
writes (`InputContract`)."""

from collections.abc import Callable
from contextvars import ContextVar
from typing import Annotated, Any, Self

from pydantic import (
    AliasChoices,
    AliasPath,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    RootModel,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.fields import FieldInfo
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


def empty_left_out(value: Any) -> bool:
    """`exclude_if` of a field a release adds to a contract whose receivers refuse unknown
    fields (`Contract`): left out of the payload while empty, so that what the release before
    sent is sent as it was, and a worker of that release still takes it."""
    return not value


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
    lost on an older receiver. Otherwise a payload is validated as its caller asks (`strict`,
    `context`, at every depth). Workflow inputs and activity requests keep refusing unknown
    fields, so that a typo is an error: a workflow's input comes from its own build or an
    earlier one, and activity contracts change additively (README, "Safe upgrades")."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="wrap")
    @classmethod
    def _ignore_unknown_fields(
        cls, value: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo
    ) -> Self:
        # `extra` above holds for this object only: its nested contracts (another build's
        # `GRPOConfig` in `LearnerDone.final`) would refuse what they do not know. A payload of
        # this build's (nearly all) is valid as it is: validated once. Else a first pass ignores
        # unknown fields at every depth; it only tells which keys of `value` are known (the
        # model, the union member each part became). `handler` then validates `value` less the
        # others, as the caller asked (`strict`, `context`, JSON or Python), which the first
        # pass cannot be told: it converts nothing that `handler` sees. (Both passes and the
        # walk between them, always, took a 600 KB `add_groups` past the SDK's 2 s deadlock
        # bound for a workflow task on a loaded machine: TMPRL1101, the task retried.)
        if not isinstance(value, dict) or _LENIENT.get():
            return handler(value)
        try:
            return handler(value)
        except ValidationError:
            pass  # unknown fields below a contract that refuses them, or a value that is wrong
        try:
            known = _leniently(cls, value, info.context)
        except ValidationError as refused:
            raise refused from None  # what is wrong, without the unknown fields' errors
        return handler(_known_part(value, known))


def _leniently(cls: type[SignalPayload], value: dict[Any, Any], context: Any) -> SignalPayload:
    """`value` validated as `cls` with unknown fields ignored at every depth (`_LENIENT`: the
    payloads it holds leave that to this pass)."""
    token = _LENIENT.set(True)
    try:
        return cls.__pydantic_validator__.validate_python(value, extra="ignore", context=context)
    finally:
        _LENIENT.reset(token)


_LENIENT: ContextVar[bool] = ContextVar("signal_payload_lenient", default=False)
"""Set while a `SignalPayload`'s first pass (unknown fields ignored at every depth) runs."""


def _known_part(value: Any, known: Any) -> Any:
    """`value` (as given) less the keys that validating it into `known` ignored, at every depth;
    `known` tells what each part became."""
    if isinstance(known, RootModel):
        return _known_part(value, known.root)
    if isinstance(known, BaseModel) and isinstance(value, dict):
        fields: dict[str, str | None] = {}  # each key a field reads: its field's name
        for name, field in type(known).model_fields.items():
            for key, target in _keys(name, field):
                fields[key] = fields.get(key) or target
        kept = known.__pydantic_extra__ or {}  # a model that allows extra fields keeps them
        return {
            key: item
            if (target := fields.get(key)) is None
            else _known_part(item, getattr(known, target))
            for key, item in value.items()
            if key in fields or key in kept
        }
    same = len(known) == len(value) if isinstance(value, list | tuple | dict) else False
    if same and isinstance(known, list | tuple) and isinstance(value, list | tuple):
        parts = [_known_part(item, got) for item, got in zip(value, known, strict=True)]
        return parts if isinstance(value, list) else tuple(parts)
    if same and isinstance(known, dict) and isinstance(value, dict):
        pairs = zip(value.items(), known.values(), strict=True)
        return {key: _known_part(item, got) for (key, item), got in pairs}
    return value


def _keys(name: str, field: FieldInfo) -> list[tuple[str, str | None]]:
    """The keys of an input that field `name` reads, each with the field's name (None: the
    first key of an alias path, kept whole)."""
    aliases = [name, field.alias, field.validation_alias]
    if isinstance(field.validation_alias, AliasChoices):
        aliases += field.validation_alias.choices
    keys: list[tuple[str, str | None]] = [(a, name) for a in aliases if isinstance(a, str)]
    paths = [a.path[0] for a in aliases if isinstance(a, AliasPath)]
    return keys + [(first, None) for first in paths if isinstance(first, str)]


class InputContract(Contract):
    """Base of a contract whose values a user writes (a run's input and what it holds, a task's
    input): NaN and infinity are refused by name ("Input should be a finite number"), where a
    bound said `temperature = nan` "should be less than or equal to 2" and a field bounded on
    one side took `inf`. Results are not inputs: a sampled token's log-prob that is not finite
    is the engine's fault, drawn again or failed for good (`infra.inference.nonfinite`), not a
    caller's bad value."""

    model_config = ConfigDict(allow_inf_nan=False)


class ObjectRef(Contract):
    """A reference to one object in the store; payloads carry these, never the bytes."""

    key: str = Field(min_length=1, description="Object key inside the configured bucket.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex digest of the content.")
