"""Real models for `python -m minicomp.bench`: HF transformers GPT-2, BERT and Llama at real hidden sizes
(a few layers, random init, no download), and a residual convnet from plain torch.nn.

transformers is an optional benchmark dependency: without it the HF rows are skipped with a note
(`available` says why). Each builder returns (module, inputs, shape text); the module returns one
tensor (the last hidden state, or the logits), so the inference and the training tables treat it
like any other case. Vocabularies are cut to 8192 rows: the embedding lookup reads a few rows per
token whatever the table's size, but a 50k-row table would count 150 MB of parameters as bytes
the case must move. Dropout is 0 so training steps compare gradients exactly with eager.
"""
from __future__ import annotations

import torch
from torch import nn

VOCAB = 8192
HF_CASES = ("hf_gpt2", "hf_bert", "hf_llama")
MODEL_CASES = HF_CASES + ("convnet",)


def available(name: str) -> str | None:
    """None when the case can be built here, else why not."""
    if name in HF_CASES:
        try:
            import transformers  # noqa: F401
        except ImportError:
            return "needs transformers (pip install transformers); skipped"
    return None


class LastHidden(nn.Module):
    """An HF model called on token ids, returning its last hidden state."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


def _hf(name: str):
    import transformers as tf
    if name == "hf_gpt2":  # GPT-2 small's width: 768 wide, 12 heads
        cfg = tf.GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=VOCAB, n_positions=1024,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
        return tf.GPT2Model(cfg), "2 layers, hidden 768, 12 heads"
    if name == "hf_bert":  # BERT-base's width
        cfg = tf.BertConfig(num_hidden_layers=2, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                            vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        return tf.BertModel(cfg, add_pooling_layer=False), "2 layers, hidden 768, 12 heads"
    if name == "hf_llama":  # SmolLM-360M's shapes: RMSNorm, rotary, SwiGLU, grouped-query attention (15/5 heads)
        cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=960, intermediate_size=2560, num_attention_heads=15,
                             num_key_value_heads=5, vocab_size=VOCAB, max_position_embeddings=2048,
                             attention_dropout=0.0)
        return tf.LlamaModel(cfg), "2 layers, hidden 960, 15/5 heads, SwiGLU 2560"
    raise ValueError(name)


class ResBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


def convnet() -> nn.Module:
    """A small ResNet: stem, three residual stages (32, 64, 128 channels), pooling, a classifier."""
    return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         ResBlock(32, 32, 1), ResBlock(32, 64, 2), ResBlock(64, 128, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def build(name: str, quick: bool, train: bool) -> tuple:
    """(module, inputs, shape) for a model case; train=False gives the module in eval mode."""
    why = available(name)
    if why:
        raise RuntimeError(f"bench case {name}: {why}")
    if name == "convnet":
        B = (2 if quick else 8) if train else (4 if quick else 16)
        m, inputs, shape = convnet(), (torch.randn(B, 3, 32, 32),), f"B{B} 3x32x32, ResNet 32-64-128"
    else:
        model, what = _hf(name)
        B, T = (1, 64) if quick else (4, 128)
        m, inputs, shape = LastHidden(model), (torch.randint(0, VOCAB, (B, T)),), f"B{B} T{T}, {what}"
    return m.train(train), inputs, shape
