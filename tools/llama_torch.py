"""Llama in PyTorch, the model pipeflow implements (src/nn/), for reference files and benchmarks.

As Hugging Face's LlamaForCausalLM computes it: RMSNorm, rotary embeddings with rotate_half pairing (and
Llama 3's rope_scaling), grouped-query attention (key/value head h // (n_head / n_kv_head) for query head h),
SwiGLU MLP, no biases, nn.Linear layout [out, in] and Hugging Face's parameter names, so that tensors move
between the two by name.
"""

import math

import torch
import torch.nn.functional as F


def rope_frequencies(head_size, theta, scaling):
    """f_i = theta^(-2i/hs), with the llama3 rope_scaling rule when scaling["factor"] != 1."""
    freqs = [theta ** (-2.0 * i / head_size) for i in range(head_size // 2)]
    if scaling["factor"] == 1:
        return torch.tensor(freqs, dtype=torch.float64)
    low_wavelength = scaling["original_max_position_embeddings"] / scaling["low_freq_factor"]
    high_wavelength = scaling["original_max_position_embeddings"] / scaling["high_freq_factor"]
    out = []
    for f in freqs:
        wavelength = 2 * math.pi / f
        if wavelength > low_wavelength:
            f = f / scaling["factor"]
        elif wavelength >= high_wavelength:
            smooth = (scaling["original_max_position_embeddings"] / wavelength - scaling["low_freq_factor"]) / (
                scaling["high_freq_factor"] - scaling["low_freq_factor"])
            f = (1 - smooth) * f / scaling["factor"] + smooth * f
        out.append(f)
    return torch.tensor(out, dtype=torch.float64)


class RmsNorm(torch.nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Block(torch.nn.Module):
    def __init__(self, c, n_head, n_kv_head, ffn, eps):
        super().__init__()
        self.n_head, self.n_kv_head = n_head, n_kv_head
        hs = c // n_head
        self.input_layernorm = RmsNorm(c, eps)
        self.self_attn = torch.nn.Module()
        self.self_attn.q_proj = torch.nn.Linear(c, n_head * hs, bias=False)
        self.self_attn.k_proj = torch.nn.Linear(c, n_kv_head * hs, bias=False)
        self.self_attn.v_proj = torch.nn.Linear(c, n_kv_head * hs, bias=False)
        self.self_attn.o_proj = torch.nn.Linear(c, c, bias=False)
        self.post_attention_layernorm = RmsNorm(c, eps)
        self.mlp = torch.nn.Module()
        self.mlp.gate_proj = torch.nn.Linear(c, ffn, bias=False)
        self.mlp.up_proj = torch.nn.Linear(c, ffn, bias=False)
        self.mlp.down_proj = torch.nn.Linear(ffn, c, bias=False)

    def attention(self, x, cos, sin):
        b, t, c = x.shape
        hs = c // self.n_head
        a = self.self_attn
        q = a.q_proj(x).view(b, t, self.n_head, hs).transpose(1, 2)
        k = a.k_proj(x).view(b, t, self.n_kv_head, hs).transpose(1, 2)
        v = a.v_proj(x).view(b, t, self.n_kv_head, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        repeat = self.n_head // self.n_kv_head
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return a.o_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x, cos, sin):
        x = x + self.attention(self.input_layernorm(x), cos, sin)
        m = self.mlp
        n = self.post_attention_layernorm(x)
        return x + m.down_proj(F.silu(m.gate_proj(n)) * m.up_proj(n))


class Llama(torch.nn.Module):
    def __init__(self, vocab_size, context, n_layer, n_head, n_kv_head, n_embd, ffn, rope_theta, rope_scaling,
                 eps, tied):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab_size, n_embd)
        self.model.layers = torch.nn.ModuleList(Block(n_embd, n_head, n_kv_head, ffn, eps) for _ in range(n_layer))
        self.model.norm = RmsNorm(n_embd, eps)
        self.tied = tied
        if not tied:
            self.lm_head = torch.nn.Linear(n_embd, vocab_size, bias=False)
        self.frequencies = rope_frequencies(n_embd // n_head, rope_theta, rope_scaling)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                torch.nn.init.ones_(p)
            else:
                torch.nn.init.normal_(p, mean=0.0, std=0.02)

    def logits(self, tokens):
        t = tokens.shape[1]
        angles = torch.arange(t, dtype=torch.float64)[:, None] * self.frequencies[None, :]
        cos = torch.cat((angles.cos(), angles.cos()), dim=-1).to(self.model.norm.weight.dtype)
        sin = torch.cat((angles.sin(), angles.sin()), dim=-1).to(self.model.norm.weight.dtype)
        x = self.model.embed_tokens(tokens)
        for block in self.model.layers:
            x = block(x, cos, sin)
        head = self.model.embed_tokens.weight if self.tied else self.lm_head.weight
        return self.model.norm(x) @ head.t()

    def forward(self, tokens, targets):
        logits = self.logits(tokens)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
