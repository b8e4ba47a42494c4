"""infra/learner_model.py on small models built in memory: the learner's forward has no dropout
(the sampler's had none) and still runs in train mode; `train_last_layers` trains an untied LM
head, as GRPOConfig says, and leaves a tied one (the embeddings) frozen."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from infra.learner_model import train_only_last_layers, without_dropout


def llama(tied: bool, attention_dropout: float = 0.0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
        attention_dropout=attention_dropout,
    )
    return LlamaForCausalLM(config)


@pytest.mark.parametrize(
    "model",
    [
        GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.5)),
        llama(tied=True, attention_dropout=0.5),
    ],
    ids=["gpt2", "llama"],
)
def test_the_learners_forward_has_no_dropout(model: torch.nn.Module) -> None:
    ids = torch.arange(12).view(1, 12)
    model.train()
    torch.manual_seed(0)
    noisy = [model(input_ids=ids).logits for _ in range(2)]
    assert not torch.equal(*noisy)  # the model as loaded drops activations
    without_dropout(model)
    assert model.training
    assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)
    assert torch.allclose(model(input_ids=ids).logits, model.eval()(input_ids=ids).logits)


def test_an_untied_head_trains_with_the_last_layers_and_a_tied_one_stays_frozen() -> None:
    untied, tied = llama(tied=False), llama(tied=True)
    for model in (untied, tied):
        train_only_last_layers(model, 1)
        assert [layer.self_attn.q_proj.weight.requires_grad for layer in model.model.layers] == [
            False,
            False,
            True,
        ]
        assert model.model.norm.weight.requires_grad
    assert untied.lm_head.weight.requires_grad
    assert not untied.model.embed_tokens.weight.requires_grad
    assert not tied.lm_head.weight.requires_grad  # it is the embedding matrix
