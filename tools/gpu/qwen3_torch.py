"""A gpt-fast-style Qwen3 in plain PyTorch, on the kern weights file: the benchmark's strongest peer.

Static KV cache, fused qkv / gate_up weights (as exported for kern), the whole
decode step under one ``torch.compile(mode="reduce-overhead")`` (Inductor +
CUDA graphs), the next token fed back on the GPU with no host sync per step,
as in https://github.com/pytorch-labs/gpt-fast. Numerics follow HF
``Qwen3ForCausalLM`` (RMS norm in f32 then weight * x.to(bf16), q/k norm per
head, neox rotary with cos/sin cast to bf16, GQA attention).

    w = load_kern_weights("weights.safetensors", "cuda")
    m = Qwen3Torch(config, w, max_seq=1024)
    logits = m.prefill(prompt_ids)           # eager, fills the cache
    step = m.compiled_decode()               # compiles once (fixed shapes)
    tok = logits.argmax(-1)                  # [1] on the GPU
    for p in range(len(prompt), ...): tok = step(tok, torch.tensor([p]))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def load_kern_weights(path, device="cuda") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path), device=str(device))


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Qwen3Torch(torch.nn.Module):
    def __init__(self, cfg: dict, w: dict[str, torch.Tensor], max_seq: int):
        super().__init__()
        self.H, self.NQ, self.NKV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.D = cfg.get("head_dim") or self.H // self.NQ
        self.L, self.eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
        self.max_seq = max_seq
        dev = w["model.embed_tokens.weight"].device
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = w.get("lm_head.weight", self.embed)
        self.norm = w["model.norm.weight"]
        self.layers = []
        for l in range(self.L):
            p = f"model.layers.{l}."
            self.layers.append({k: w[p + n] for k, n in (
                ("in", "input_layernorm.weight"), ("qkv", "self_attn.qkv_proj.weight"),
                ("qn", "self_attn.q_norm.weight"), ("kn", "self_attn.k_norm.weight"),
                ("o", "self_attn.o_proj.weight"), ("post", "post_attention_layernorm.weight"),
                ("gu", "mlp.gate_up_proj.weight"), ("down", "mlp.down_proj.weight"))})
        cs = w["rope.cos_sin"][:max_seq]  # f32 [positions, D]: cos(p f_j) then sin(p f_j)
        half = self.D // 2
        self.cos = torch.cat([cs[:, :half], cs[:, :half]], -1).to(torch.bfloat16)
        self.sin = torch.cat([cs[:, half:], cs[:, half:]], -1).to(torch.bfloat16)
        shape = (self.L, 1, self.NKV, max_seq, self.D)
        self.k_cache = torch.zeros(shape, dtype=torch.bfloat16, device=dev)
        self.v_cache = torch.zeros(shape, dtype=torch.bfloat16, device=dev)
        self.causal = torch.ones(max_seq, max_seq, dtype=torch.bool, device=dev).tril()

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens, pos: i64 [T] -> logits of the last token [1, V] (bf16)."""
        T, D, NQ, NKV = tokens.shape[0], self.D, self.NQ, self.NKV
        x = F.embedding(tokens, self.embed)  # [T, H]
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]  # [1, 1, T, D]
        mask = self.causal[pos][None, None]  # [1, 1, T, S]
        residual = x
        for l, lw in enumerate(self.layers):
            h = rms_norm(residual, lw["in"], self.eps)
            q, k, v = (h @ lw["qkv"].t()).split([NQ * D, NKV * D, NKV * D], dim=-1)
            q = rms_norm(q.view(T, NQ, D), lw["qn"], self.eps).transpose(0, 1)[None]  # [1, NQ, T, D]
            k = rms_norm(k.view(T, NKV, D), lw["kn"], self.eps).transpose(0, 1)[None]
            v = v.view(T, NKV, D).transpose(0, 1)[None]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.k_cache[l].index_copy_(2, pos, k)
            self.v_cache[l].index_copy_(2, pos, v)
            kk = self.k_cache[l].repeat_interleave(NQ // NKV, dim=1)
            vv = self.v_cache[l].repeat_interleave(NQ // NKV, dim=1)
            a = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask)  # [1, NQ, T, D]
            residual = residual + a[0].transpose(0, 1).reshape(T, NQ * D) @ lw["o"].t()
            h = rms_norm(residual, lw["post"], self.eps)
            gate, up = (h @ lw["gu"].t()).chunk(2, dim=-1)
            residual = residual + (F.silu(gate) * up) @ lw["down"].t()
        x = rms_norm(residual[-1:], self.norm, self.eps)
        return x @ self.lm_head.t()

    @torch.no_grad()
    def prefill(self, ids) -> torch.Tensor:
        t = torch.as_tensor(ids, dtype=torch.long, device=self.embed.device)
        return self.forward(t, torch.arange(len(ids), device=t.device))

    def decode_step(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """token, pos: i64 [1] on the GPU -> next token i64 [1] (greedy)."""
        return self.forward(token, pos).argmax(-1)

    def compiled_decode(self):
        """One torch.compile of the decode step (fixed shapes: compiles once), CUDA graphs on.

        Outputs of a CUDA-graph replay are overwritten by the next replay, so the
        returned token is cloned; mark_step_begin tells cudagraph trees a new step began.
        """
        # Weights, tables and caches keep their addresses: mark them static so the CUDA
        # graph reads them in place (otherwise each replay would copy them in as inputs).
        for t in (self.embed, self.lm_head, self.norm, self.cos, self.sin, self.causal, self.k_cache, self.v_cache,
                  *(t for lw in self.layers for t in lw.values())):
            torch._dynamo.mark_static_address(t)
        fn = torch.compile(self.decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)

        @torch.no_grad()
        def step(token, pos):
            torch.compiler.cudagraph_mark_step_begin()
            return fn(token, pos).clone()

        return step
