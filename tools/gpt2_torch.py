"""GPT-2 in PyTorch, the model pipeflow implements (src/nn/), for reference files and benchmarks.

Same definition as pipeflow's: pre-LN blocks, GELU tanh approximation, LayerNorm eps 1e-5,
LM head tied to wte, no dropout, weights stored in Hugging Face Conv1D layout [in, out] so
that tensors move between the two by name without a transpose.
"""

import math

import torch
import torch.nn.functional as F


class Conv1D(torch.nn.Module):
    """Hugging Face GPT-2's linear layer: y = x @ weight + bias, weight [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
        self.bias = torch.nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Block(torch.nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = torch.nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = torch.nn.Module()
        self.attn.c_attn = Conv1D(n_embd, 3 * n_embd)
        self.attn.c_proj = Conv1D(n_embd, n_embd)
        self.ln_2 = torch.nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = torch.nn.Module()
        self.mlp.c_fc = Conv1D(n_embd, 4 * n_embd)
        self.mlp.c_proj = Conv1D(4 * n_embd, n_embd)

    def attention(self, x):
        b, t, c = x.shape
        hs = c // self.n_head
        q, k, v = self.attn.c_attn(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, hs).transpose(1, 2)
        k = k.view(b, t, self.n_head, hs).transpose(1, 2)
        v = v.view(b, t, self.n_head, hs).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = scores.masked_fill(~mask, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.attn.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt2(torch.nn.Module):
    def __init__(self, vocab_size, n_ctx, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab_size, n_embd)
        self.wpe = torch.nn.Embedding(n_ctx, n_embd)
        self.h = torch.nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(n_embd, eps=1e-5)
        self.init_gpt2(n_layer)

    def init_gpt2(self, n_layer):
        """N(0, 0.02) weights, residual projections scaled by 1/sqrt(2 L), zero biases."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif "ln_" in name:
                torch.nn.init.ones_(p)
            else:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                torch.nn.init.normal_(p, mean=0.0, std=std)

    def logits(self, tokens):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()

    def forward(self, tokens, targets):
        logits = self.logits(tokens)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def decay_groups(model):
    """AdamW parameter groups, nanoGPT's convention (and pipeflow's): 2-D weights decay,
    biases and LayerNorm parameters do not."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return decay, no_decay


def adamw_losses(model, inputs, targets, adamw, steps):
    """The reference files' training loop: per step zero the gradients, forward, backward, clip to the global
    norm adamw["grad_clip"], AdamW (decay on 2-D tensors only); the loss before each of `steps` steps and after
    the last."""
    decay, no_decay = decay_groups(model)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": adamw["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=adamw["lr"], betas=(adamw["beta1"], adamw["beta2"]), eps=adamw["eps"])
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        step_loss = model(inputs, targets)
        losses.append(step_loss.item())
        step_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), adamw["grad_clip"])
        optimizer.step()
    with torch.no_grad():
        losses.append(model(inputs, targets).item())
    return losses


def corpus_batch(context, batch, offset=0, corpus="/usr/share/games/fortunes/fortunes"):
    """The reference files' batch: `batch` rows of context + 1 bytes of the fortunes corpus, row i from byte
    1000·i + offset (inputs [:, :-1], targets [:, 1:]), as int32."""
    with open(corpus, "rb") as f:
        text = f.read()
    rows = [list(text[1000 * i + offset:1000 * i + offset + context + 1]) for i in range(batch)]
    return torch.tensor(rows, dtype=torch.int32)
