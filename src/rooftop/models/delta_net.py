"""Gated DeltaNet (the linear-attention layers of Qwen3.5 and Qwen3-Next): per sequence, a fixed-size state S
(value heads x key dim x value dim) instead of a KV cache that grows with the context.

Per token t, with an L2-normalized key k, query q (scaled by key_dim^-1/2), value v, decay g <= 0 (log space) and
write strength beta in (0, 1):

    S <- exp(g) S;   u = beta (v - S^T k);   S <- S + k u^T;   o = S^T q

`recurrent` runs that token by token (decode); `chunked` computes the same over chunks of 64 tokens with matmuls
(prefill): inside a chunk, with gamma the running sum of g, S_t = e^gamma_t S0 + sum_{s<=t} e^(gamma_t - gamma_s) k_s
u_s^T, so the chunk's u solve one unit lower-triangular system (I + diag(beta) A) U = diag(beta) (V - e^gamma K S0),
A[t, s] = e^(gamma_t - gamma_s) k_t.k_s for s < t; the outputs are O = e^gamma Q S0 + (M o Q K^T) U with
M[t, s] = e^(gamma_t - gamma_s) for s <= t, and the state leaves as e^gamma_C S0 + (e^(gamma_C - gamma) K)^T U.
Both forms are float32; their agreement is a test.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rooftop.models.ops import rowwise

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / |x| over the last dim, as the reference implementations (FLA, transformers) compute it."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def recurrent(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens one at a time. q, k: (T, H, dk) normalized and scaled; v: (T, H, dv); g, beta: (T, H); state
    (H, dk, dv), or (T, H, dk, dv) with T independent sequences of one token each when `q` has one per sequence
    (a step's decodes: `state` then holds each one's). Returns the outputs (T, H, dv) and the new state. The sums
    run over fixed dims, so one sequence's numbers do not depend on how many share the call."""
    if state.dim() == 4:  # one token for each of T sequences
        state = state * rowwise(torch.exp, g)[..., None, None]
        u = (v - (state * k[..., None]).sum(-2)) * beta[..., None]
        state = state + k[..., None] * u[..., None, :]
        return (state * q[..., None]).sum(-2), state
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        u = (v[t] - (state * k[t][..., None]).sum(-2)) * beta[t][:, None]
        state = state + k[t][..., None] * u[:, None, :]
        out[t] = (state * q[t][..., None]).sum(-2)
    return out, state


def chunked(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's T tokens in chunks of CHUNK (the module docstring's algebra); shapes as `recurrent` with a
    (H, dk, dv) state. The last chunk is padded with k = v = 0, g = beta = 0, which leave the state as it is."""
    T = q.shape[0]
    pad = -T % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(0, 1) for x in (q, k, v))  # (H, T', d)
    g, beta = (F.pad(x, (0, 0, 0, pad)).transpose(0, 1) for x in (g, beta))  # (H, T')
    H, n = q.shape[0], q.shape[1] // CHUNK
    q, k, v = (x.reshape(H, n, CHUNK, -1) for x in (q, k, v))
    g, beta = g.reshape(H, n, CHUNK), beta.reshape(H, n, CHUNK)
    gamma = g.cumsum(-1)
    decay = (
        (gamma[..., :, None] - gamma[..., None, :])
        .masked_fill(torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        .exp()
    )  # M: e^(gamma_t - gamma_s) for s <= t, 0 above the diagonal
    system = (k * beta[..., None]) @ k.transpose(-1, -2) * decay  # diag(beta) A, with the diagonal ignored below
    values = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    keys = torch.linalg.solve_triangular(system, k * (beta * gamma.exp())[..., None], upper=False, unitriangular=True)
    scores = q @ k.transpose(-1, -2) * decay
    q_decayed = q * gamma.exp()[..., None]
    k_to_end = k * (gamma[..., -1:] - gamma).exp()[..., None]
    out = torch.empty_like(v)
    for c in range(n):
        u = values[:, c] - keys[:, c] @ state
        out[:, c] = q_decayed[:, c] @ state + scores[:, c] @ u
        state = state * gamma[:, c, -1].exp()[:, None, None] + k_to_end[:, c].transpose(-1, -2) @ u
    return out.reshape(H, n * CHUNK, -1)[:, :T].transpose(0, 1), state


def causal_conv(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The short depthwise causal convolution before the delta rule, then SiLU. x: (T, C) of one sequence;
    weight: (C, K); state: (C, K - 1), the sequence's last K - 1 inputs (zeros before its first token). Returns
    the outputs (T, C) and the new state."""
    window = torch.cat([state, x.t()], dim=1)  # (C, K - 1 + T)
    out = F.conv1d(window[None], weight[:, None, :], groups=weight.shape[0])[0]  # (C, T)
    return rowwise(F.silu, out.t()), window[:, -(weight.shape[1] - 1) :]


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each head's output, times its weight and SiLU of the output gate z (in float32)."""
    x = x.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed * rowwise(F.silu, gate.float().flatten(1)).reshape(gate.shape)
