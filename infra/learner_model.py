"""How the learner prepares the policy it trains: which parameters train, and no dropout.

    model = AutoModelForCausalLM.from_pretrained(policy_dir)
    without_dropout(model)                 # the sampler ran without it: so does the learner
    train_only_last_layers(model, 6)       # the last 6 decoder layers, the final norm, the head

Used by `infra.learner_engine` (and bench/trl_side.py, which trains the same parameters). Not
covered: decoders that keep their layers elsewhere than `model.layers` (Llama-style) when only
the last layers train.
"""

from __future__ import annotations

import torch


def train_only_last_layers(model: torch.nn.Module, layers: int) -> None:
    """Freeze all but the last `layers` decoder layers, the final norm and an untied LM head
    (0: train everything).

    On CPU this is what makes a 135M-parameter step affordable: backward stops at the first
    trainable layer. Embeddings stay frozen, and with them a head tied to them (SmolLM2's).
    """
    if layers <= 0:
        model.requires_grad_(True)
        return
    decoder = getattr(getattr(model, "model", None), "layers", None)
    if decoder is None:
        raise ValueError("train_last_layers needs a decoder with `model.layers` (Llama-style)")
    model.requires_grad_(False)
    for layer in list(decoder)[-layers:]:
        layer.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)
    head, embeddings = (
        _module(model, "get_output_embeddings"),
        _module(model, "get_input_embeddings"),
    )
    if head is not None and (embeddings is None or head.weight is not embeddings.weight):
        head.requires_grad_(True)


def without_dropout(model: torch.nn.Module) -> None:
    """Turn every dropout of `model` off, in place (its saved config is left as it was).

    Inference samples without dropout, so the learner's log-probs must have none either: the
    importance ratio and KL would measure dropout noise. The model stays in train mode
    (gradient checkpointing runs only there): dropout modules get p = 0, and attention layers'
    dropout rates (floats such as Llama's `attention_dropout`, read in train mode) become 0.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        for name, value in list(vars(module).items()):
            if "dropout" in name and type(value) is float:
                setattr(module, name, 0.0)


def _module(model: torch.nn.Module, getter: str) -> torch.nn.Module | None:
    get = getattr(model, getter, None)
    found = get() if callable(get) else None
    return found if isinstance(found, torch.nn.Module) else None
