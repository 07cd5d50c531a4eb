"""Each decoder layer's MLP, RMS norms and rotary embedding through ``torch.compile``
(``DecodeConfig.compile_layers``).

What a compiler fuses in a transformer's forward is its element-wise work: an RMS norm (square,
mean, reciprocal square root, two products, casts), a gated MLP's activation and product between
its projections, and the rotary embedding of queries and keys (two products, a negation, a
concatenation and a sum for each) are each one kernel compiled against many eager ones, each of
which reads and writes the whole activation. Attention stays the engine's own (hpd_core/attention.py: its indexing would be
broken into pieces), and the linear layers stay cuBLAS's (or the CPU's) matrix products.

Measured (``scripts/compile_ab.py``, HPD's timed run eager against compiled, alternating in one
process): on an H200 at 512 long products (Qwen3-8B's shape, random bf16 weights, packed steps,
session 34) compiled 18.35-20.29 s against eager 20.90-21.77 s, median 1.17x, the values of all
128 prompts identical; on the 2-core AMD EPYC CPU (session 33) within the noise, with 4 of 16
prompts' bf16 values changed (slower in session 36), until the CPU's own pieces below. The small
default model lost on a GPU in a job of 491 products (session 35: 5.08 s busy decoding against
3.18 s). So ``"auto"`` compiles on CUDA for models of at least
``config.COMPILE_MIN_BODY_PARAMETERS`` body parameters, and on a CPU in bfloat16 (``for_cpu``).

``CompiledLayers`` compiles each piece's forward once (``dynamic=True``: one graph for every token
count) and hands it every input as (tokens, features): the pieces work token by token, and the
shapes the engine gives them differ in rank (a norm over (rows, queries, hidden) or over a query's
heads, (rows, queries, heads, head_dim)) and in dimensions of size 1 (a one-row batch, one query per
row), each of which the compiler would otherwise compile again, inside timed runs (on an H200,
session 35, the baseline at 512 long products ran 20% slower compiled, from recompiling mid-run;
most likely from recompiling mid-run; only a single token now makes a second graph). The rotary
embedding is the modeling module's function ``apply_rotary_pos_emb(q, k, cos, sin)``, which every
supported architecture's attention calls by that name; it gets queries and keys as (tokens, heads,
head_dim) and cos and sin as (tokens, head_dim) the same way (``rotary_home``). The compiled
forwards and function are swapped in only around the engine's own forward passes (``active``), as
``attention.engine_attention`` does for attention, so a model shared with other code keeps its
eager modules (the function is the module's, so another thread calling the same architecture's
attention meanwhile would get the compiled one: the same arithmetic, fused). While a CUDA graph is being recorded (hpd_core/graphs.py) the pieces run eagerly: a
compiled kernel's first launch may tune itself by running, which a capture would record. If
compiling fails (no compiler for the device, an operator the compiler does not take), the failure is
logged once and the pieces run eagerly for good: the same arithmetic, unfused.

**On a CPU** (``for_cpu``) the pieces are the element-wise work alone, and only from
``CPU_MIN_TOKENS`` tokens a call. A gated MLP's projections stay eager (the compiler hands them to
the same matrix products) and only its activation and product are compiled, with the tanh GELU
(Gemma's) written as ``x * sigmoid(2u)``, which is ``0.5 x (1 + tanh(u))``: a CPU's vectorised
``tanh`` is several times slower than its ``sigmoid`` (on the 2-core AMD EPYC sandbox, 780 x 2,048
in bf16: eager GELU and product 2.2 ms, compiled through ``tanh`` 2.0 ms, through ``sigmoid``
0.74 ms). Below ``CPU_MIN_TOKENS`` a compiled call's own cost outweighs what it saves (a norm over
16 tokens: 0.039 ms compiled, 0.022 eager). The kernels round where eager rounds
(``emulate_precision_casts``): the activation is rounded to the model's dtype before its product,
as in eager bf16, so fewer values move. Measured on that sandbox (session 44, the README's 96
titles, one thread, ``scripts/compile_ab.py``: HPD's timed run alternating in one process, five
runs each): prefills 0.655-0.664 ms a token against 0.700-0.731 eager, whole runs 8.94-9.15 s
against 9.45-9.86 s, 10 of 16 prompts' bf16 values identical (docs/benchmarks.md); float32 keeps
the eager pieces (``DecodeConfig.compiles``).
"""

from __future__ import annotations

import logging
import math
import sys
from contextlib import contextmanager
from typing import Iterator

import torch

log = logging.getLogger(__name__)


def layer_pieces(body) -> list[torch.nn.Module]:
    """Each decoder layer's MLP and RMS norms (the attention's query and key norms included), from
    the model's body (``model.get_decoder()``: the module that holds ``layers``)."""
    pieces = []
    for layer in body.layers:
        for name, module in layer.named_children():
            if name == "mlp" or name.endswith("norm"):
                pieces.append(module)
        attn = getattr(layer, "self_attn", None)
        for name in ("q_norm", "k_norm"):  # Qwen3, Gemma 3
            if attn is not None and getattr(attn, name, None) is not None:
                pieces.append(getattr(attn, name))
    return pieces


def rotary_home(body):
    """The modeling module whose ``apply_rotary_pos_emb`` the layers' attention calls (transformers'
    Llama, Mistral, Qwen2/3, Phi-3 and Gemma 3 all call it by that name), or None."""
    attn = getattr(body.layers[0], "self_attn", None) if len(body.layers) else None
    module = sys.modules.get(type(attn).__module__) if attn is not None else None
    return module if callable(getattr(module, "apply_rotary_pos_emb", None)) else None


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


CPU_MIN_TOKENS = 64  # on a CPU, calls over fewer tokens run the eager pieces (see the module's docstring)
_C = math.sqrt(2.0 / math.pi)


def gelu_tanh_product(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``gelu(gate, approximate="tanh") * up`` with the GELU as ``x * sigmoid(2u)``, u = sqrt(2/pi)
    (x + 0.044715 x^3): the same function, computed in float32 and rounded to ``gate``'s dtype before
    the product, as eager does."""
    x = gate.float()
    act = x * torch.sigmoid(x * (2 * _C + (2 * _C * 0.044715) * x * x))
    return act.to(gate.dtype) * up


def gelu_tanh_mlp(module) -> bool:
    """Whether ``module`` is a gated MLP, ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, whose
    activation is the tanh GELU (Gemma's ``gelu_pytorch_tanh``)."""
    from transformers.activations import GELUTanh, PytorchGELUTanh

    parts = ("gate_proj", "up_proj", "down_proj")
    return all(isinstance(getattr(module, p, None), torch.nn.Linear) for p in parts) and isinstance(
        getattr(module, "act_fn", None), (GELUTanh, PytorchGELUTanh))  # fmt: skip


class CompiledLayers:
    """The model's layer pieces (``layer_pieces``) with compiled forwards, switched on by ``active``.

    ``min_tokens``: calls over fewer tokens run the eager pieces. ``gelu_products``: a tanh-GELU
    gated MLP (``gelu_tanh_mlp``) keeps its projections eager and compiles ``gelu_tanh_product``
    between them, instead of compiling its whole forward. ``eager_rounding``: the kernels round
    to 16 bits where eager does (inductor's ``emulate_precision_casts``), so fewer 16-bit values
    move. ``for_cpu`` sets all three for a CPU."""

    def __init__(self, body, backend="inductor", min_tokens: int = 0, gelu_products: bool = False,
                 eager_rounding: bool = False):  # fmt: skip
        self.modules = layer_pieces(body)
        self.eager = [m.forward for m in self.modules]
        self.own = ["forward" in m.__dict__ for m in self.modules]  # an instance's own forward, put back
        self.failed = False  # compiling failed once: eager from then on
        self.min_tokens = min_tokens
        options = {"emulate_precision_casts": True} if eager_rounding and backend == "inductor" else None
        compile_piece = lambda f: torch.compile(f, dynamic=True, backend=backend, options=options)  # noqa: E731
        product = compile_piece(gelu_tanh_product) if gelu_products else None
        self.forwards = [
            self._gelu_mlp(m, product) if product is not None and gelu_tanh_mlp(m) else self._guarded(compile_piece(f), f)
            for m, f in zip(self.modules, self.eager)
        ]
        self.home = rotary_home(body)
        if self.home is not None:
            self.rotary_eager = self.home.apply_rotary_pos_emb
            self.rotary = self._rotary(compile_piece(self.rotary_eager), self.rotary_eager)

    @classmethod
    def for_cpu(cls, body, backend="inductor") -> "CompiledLayers":
        return cls(body, backend, min_tokens=CPU_MIN_TOKENS, gelu_products=True, eager_rounding=True)

    @classmethod
    def for_device(cls, body, device) -> "CompiledLayers":
        """The pieces a model on ``device`` compiles: on a CPU ``for_cpu``'s, else every piece whole."""
        return cls.for_cpu(body) if torch.device(device).type == "cpu" else cls(body)

    def _eager_now(self, tokens: int) -> bool:
        return self.failed or _capturing() or tokens < self.min_tokens

    def _fail(self, error: Exception) -> None:
        self.failed = True
        log.warning("compiling the layers' MLPs, norms and rotary embeddings failed, they run eagerly (same "
                    "arithmetic, slower): %s", str(error).splitlines()[0] if str(error) else type(error).__name__)  # fmt: skip

    def _guarded(self, compiled, eager):
        def forward(hidden, *args, **kwargs):
            if self._eager_now(hidden.numel() // max(hidden.shape[-1], 1)):
                return eager(hidden, *args, **kwargs)
            try:  # per-token pieces: every shape as (tokens, features), the one shape the compiler sees
                out = compiled(hidden.reshape(-1, hidden.shape[-1]), *args, **kwargs)
                return out.reshape(*hidden.shape[:-1], out.shape[-1])
            except torch._dynamo.exc.TorchDynamoException as error:  # a backend's failure is one
                self._fail(error)
                return eager(hidden, *args, **kwargs)

        return forward

    def _gelu_mlp(self, mlp, product):
        def forward(hidden):
            gate, up = mlp.gate_proj(hidden), mlp.up_proj(hidden)
            tokens = gate.numel() // gate.shape[-1]
            if not self._eager_now(tokens):
                try:  # (tokens, features), as the other pieces
                    inner = product(gate.reshape(tokens, -1), up.reshape(tokens, -1)).reshape(gate.shape)
                    return mlp.down_proj(inner)
                except torch._dynamo.exc.TorchDynamoException as error:
                    self._fail(error)
            return mlp.down_proj(mlp.act_fn(gate) * up)

        return forward

    def _rotary(self, compiled, eager):
        def apply(q, k, cos, sin, unsqueeze_dim=1):
            shaped = q.dim() == 4 and unsqueeze_dim == 1 and cos.shape[:2] == (q.shape[0], q.shape[2])
            if not shaped or self._eager_now(q.shape[0] * q.shape[2]):
                return eager(q, k, cos, sin, unsqueeze_dim)
            # (rows, heads, queries, head_dim) as (tokens, heads, head_dim): a view of the layout
            # the projections wrote, (rows, queries, heads, head_dim); cos and sin as (tokens, head_dim)
            b, _, a, _ = q.shape
            tokens = lambda x: x.transpose(1, 2).reshape(b * a, x.shape[1], x.shape[3])  # noqa: E731
            back = lambda x, like: x.reshape(b, a, like.shape[1], like.shape[3]).transpose(1, 2)  # noqa: E731
            try:
                q2, k2 = compiled(tokens(q), tokens(k), cos.reshape(b * a, -1), sin.reshape(b * a, -1))
            except torch._dynamo.exc.TorchDynamoException as error:
                self._fail(error)
                return eager(q, k, cos, sin, unsqueeze_dim)
            return back(q2, q), back(k2, k)

        return apply

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the pieces run their compiled forwards; their own ones after it."""
        for module, forward in zip(self.modules, self.forwards):
            module.forward = forward
        if self.home is not None:
            self.home.apply_rotary_pos_emb = self.rotary
        try:
            yield
        finally:
            if self.home is not None:
                self.home.apply_rotary_pos_emb = self.rotary_eager
            for module, eager, own in zip(self.modules, self.eager, self.own):
                if own:
                    module.forward = eager
                else:
                    del module.forward  # the class's forward again
