"""Policy-invariant per-token decode work on the accelerator, with the geometry's real shapes.

Per token: an embedding row, then every transformer block (attention over a KV cache of the
token's context; a dense FFN in the leading dense blocks; in MoE blocks the router, the routing
weights of the traced experts and the shared experts), then the LM head. The routed experts are
not here: the execution strategies run them between :meth:`SharedWork.moe_block` and
:meth:`SharedWork.end_block`.

Stand-ins, chosen so the work has the model's size: attention uses full heads (as the memory
model does); a dense block's FFN has ``expert_intermediate * (top_k + n_shared_experts)`` columns
(DeepSeek-V2-Lite's first block: 10944 vs 11264 here); shared experts have the routed experts'
shape; the embedding is a small table (one row is read per token either way).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import CopeInputError
from ..geometry import ModelGeometry
from .execution import LayerIO
from .experts import expert_ffn
from .weights import Filler, expert_numel, fill_expert

_EMBED_ROWS = 16


def _rms(h: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)


class SharedWork:
    """Weights, KV cache and residual stream of the shared decode path (see the module doc).

    Parameters
    ----------
    acc : Accelerator
    g : ModelGeometry
    dtype : torch.dtype
    io : LayerIO
        The MoE layer buffers: ``moe_block`` writes the experts' input and routing weights there
        and ``end_block`` adds the routed output back into the residual stream.
    max_context : int
        Largest context a token may have (the KV cache holds ``max_context + 1`` positions).
    """

    def __init__(self, acc, g: ModelGeometry, dtype: torch.dtype, io: LayerIO, max_context: int,
                 filler: Filler | None = None):
        self.acc, self.g, self.dtype, self.io = acc, g, dtype, io
        self.max_context = int(max_context)
        if g.n_kv_heads and g.n_heads % g.n_kv_heads:
            raise CopeInputError(f"n_heads={g.n_heads} is not a multiple of n_kv_heads="
                                 f"{g.n_kv_heads}", field="model.n_kv_heads")
        f = filler or Filler(1)
        H, L, B = g.hidden, g.n_layers, g.dense_layers + g.n_layers
        qd, kvd = g.n_heads * g.head_dim, g.n_kv_heads * g.head_dim
        alloc = acc.alloc
        self.wq = f.fill(alloc((B, qd, H), dtype), 1, H)
        self.wkv = f.fill(alloc((B, 2 * kvd, H), dtype), 2, H)
        self.wo = f.fill(alloc((B, H, max(qd, 1)), dtype), 3, max(qd, 1))
        self.kv = f.fill(alloc((B, 2, g.n_kv_heads, self.max_context + 1, g.head_dim), dtype), 4,
                         max(g.head_dim, 1))
        self.router = f.fill(alloc((L, g.n_experts, H), dtype), 5, H)
        self.shared = alloc((L, g.n_shared_experts, expert_numel(g)), dtype)
        for l in range(L):
            for s in range(g.n_shared_experts):
                fill_expert(f, self.shared[l, s], g, 1_000 + l * g.n_shared_experts + s)
        di = g.dense_intermediate
        self.dense_w13 = f.fill(alloc((g.dense_layers, 2 * di, H), dtype), 6, H)
        self.dense_w2 = f.fill(alloc((g.dense_layers, H, di), dtype), 7, di)
        self.lm_head = f.fill(alloc((max(g.vocab, 1), H), dtype), 8, H)
        self.embed = f.fill(alloc((_EMBED_ROWS, H), torch.float32), 9, 1)
        self.h = alloc((1, H), torch.float32)
        self.logits = alloc((1, max(g.vocab, 1)), dtype)
        self.pred_logits = alloc((1, g.n_experts), dtype)
        self.routed_dev = alloc((g.top_k,), torch.int64)
        self.routed_host = acc.host_alloc((g.top_k,), torch.int64)
        self._scale = 1.0 / math.sqrt(max(g.head_dim, 1))

    # --- host-facing steps (each queues work on the compute stream) ------------------------------
    def begin_token(self, token: int, context: int) -> None:
        """Embedding and the leading dense blocks of one token at ``context``."""
        self.embed_token(token)
        for b in range(self.g.dense_layers):
            self.dense_block(b, context)

    def embed_token(self, token: int) -> None:
        """The token's embedding row into the residual stream."""
        self.acc.compute.submit(self.h.copy_, self.embed[token % _EMBED_ROWS])

    def dense_block(self, block: int, context: int) -> None:
        """Leading dense block ``block``: attention and its FFN (queued, nothing waited for)."""
        self._check_context(context)
        self.acc.compute.submit(self._dense, block, context)

    def moe_block(self, layer: int, context: int, routed: np.ndarray | list[int]) -> None:
        """Attention, router, routing weights and shared experts of MoE block ``layer``; returns
        when the routing is known on the host (as a runtime reads the top-k ids)."""
        self._check_context(context)
        self.routed_host.copy_(torch.as_tensor(np.asarray(routed, dtype=np.int64)))
        self.acc.compute.submit(self._moe, layer, context)
        self.acc.compute.record().synchronize()

    def end_block(self) -> None:
        """Add the routed experts' output to the residual stream."""
        self.acc.compute.submit(self.h.add_, self.io.out)

    def end_token(self) -> None:
        """Final norm and LM head; returns when the token is complete."""
        self.acc.compute.submit(self._head)
        self.wait()

    def wait(self) -> None:
        """Return when all queued shared work is done."""
        self.acc.compute.record().synchronize()

    def predict_next(self, layer: int) -> None:
        """The next-layer predictor's work (its router applied to this layer's expert input);
        the ids it stands for come from the trace's ``predicted`` column."""
        nxt = min(layer + 1, self.g.n_layers - 1)
        self.acc.compute.submit(_linear_into, self.pred_logits, self.io.x, self.router[nxt])

    # --- device work ---------------------------------------------------------------------------
    def _check_context(self, context: int) -> None:
        if not 0 <= context <= self.max_context:
            raise ValueError(f"context {context} outside the KV cache (0..{self.max_context})")

    def _attention(self, block: int, ctx: int) -> None:
        g, dt = self.g, self.dtype
        if g.n_heads == 0 or g.head_dim == 0 or g.n_kv_heads == 0:
            return
        xn = _rms(self.h, dt)
        q = F.linear(xn, self.wq[block]).view(g.n_kv_heads, g.n_heads // g.n_kv_heads, g.head_dim)
        cache = self.kv[block]
        cache[:, :, ctx].copy_(F.linear(xn, self.wkv[block]).view(2, g.n_kv_heads, g.head_dim))
        scores = torch.matmul(q, cache[0, :, : ctx + 1].transpose(1, 2)).float() * self._scale
        o = torch.matmul(torch.softmax(scores, -1).to(dt), cache[1, :, : ctx + 1])
        self.h.add_(F.linear(o.reshape(1, -1), self.wo[block]).float())

    def _dense(self, b: int, ctx: int) -> None:
        self._attention(b, ctx)
        xn = _rms(self.h, self.dtype)
        gu = F.linear(xn, self.dense_w13[b])
        a, u = gu.split(gu.shape[-1] // 2, dim=-1)
        self.h.add_(F.linear(F.silu(a) * u, self.dense_w2[b]).float())

    def _moe(self, layer: int, ctx: int) -> None:
        g, io = self.g, self.io
        self._attention(g.dense_layers + layer, ctx)
        xn = _rms(self.h, self.dtype)
        io.x.copy_(xn)
        self.routed_dev.copy_(self.routed_host, non_blocking=True)
        logits = F.linear(xn, self.router[layer]).float()[0]
        io.w.copy_(torch.softmax(logits.index_select(0, self.routed_dev), 0))
        for s in range(g.n_shared_experts):
            self.h.add_(expert_ffn(xn, self.shared[layer, s], g.hidden, g.expert_intermediate)
                        .float())

    def _head(self) -> None:
        _linear_into(self.logits, _rms(self.h, self.dtype), self.lm_head)


def _linear_into(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    out.copy_(F.linear(x, w))
