"""Expert FFN compute (gate/up/down with SiLU), the same code on the host and the accelerator,
and the dense reference the exactness test compares every candidate with."""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F


def expert_ffn(x: torch.Tensor, flat: torch.Tensor, hidden: int, inter: int) -> torch.Tensor:
    """One expert on one token: ``down(silu(gate x) * up x)``, in the weights' dtype.

    ``flat`` holds gate and up as one ``[2I, H]`` matrix followed by down ``[H, I]``, the
    layout of a store entry and of a slot, so staging an expert is one contiguous copy."""
    n13 = 2 * inter * hidden
    gu = F.linear(x, flat[:n13].view(2 * inter, hidden))
    g, u = gu.split(inter, dim=-1)
    return F.linear(F.silu(g) * u, flat[n13:].view(hidden, inter))


def accumulate(out: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, positions: Sequence[int],
               experts: Sequence[torch.Tensor], hidden: int, inter: int) -> None:
    """``out += sum_j weights[positions[j]] * expert_j(x)``, accumulated in ``out``'s dtype
    (float32). ``weights`` are the routing weights of the layer's ``top_k`` routed experts."""
    for p, w in zip(positions, experts):
        out.add_(expert_ffn(x, w, hidden, inter).float().mul_(weights[p]))


def dense_reference(x: torch.Tensor, weights: torch.Tensor, experts: Sequence[torch.Tensor],
                    hidden: int, inter: int) -> torch.Tensor:
    """The MoE layer computed plainly in float32: every routed expert from its host weights,
    in routed order. ``experts[j]`` belongs to routed position ``j``."""
    x32 = x.float()
    out = torch.zeros(x32.shape, dtype=torch.float32)
    for j, w in enumerate(experts):
        out += expert_ffn(x32, w.float(), hidden, inter) * weights[j].float()
    return out


#: Tolerances "of the dtype" for comparing a candidate's layer output with the reference:
#: (rtol, atol relative to the reference's largest magnitude). Candidates compute in the model
#: dtype and sum in a different order; float32 references round differently by a few ulps.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.bfloat16: (3e-2, 3e-2), torch.float16: (4e-3, 4e-3), torch.float32: (1e-5, 1e-5)}


def close_to_reference(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> bool:
    rtol, atol = TOLERANCE[dtype]
    scale = float(ref.abs().max()) or 1.0
    return bool(torch.allclose(out.float(), ref, rtol=rtol, atol=atol * scale))
