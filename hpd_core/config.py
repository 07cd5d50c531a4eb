"""Engine configuration: frozen dataclasses, validated once at construction. All defaults live here."""

from __future__ import annotations

from dataclasses import dataclass

DECODERS = ("hpd", "ar", "reference")
SKELETONS = ("interleaved", "after-products")  # where HPD's keys go (prompts.skeleton_segments)
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: models.resolve_dtype
STEP_SHAPES = ("auto", "packed", "fixed")  # how decode steps are laid out (DecodeConfig.step_shape)
# "auto" on CUDA: an HPD batch whose fixed step would do at least this much matrix work (2 x body
# parameters x rows x slots) takes packed steps instead. Measured on an H200 with Qwen3-8B's shape
# (session 32, docs/gpu-session.md): packed against fixed HPD steps 0.90x at 7 TFLOP a fixed step
# (titles, 528 tokens), 1.05x at 14 TFLOP (long products, 1,024 tokens), 1.65x at ~89 TFLOP (512
# long products, ~100 rows x 64 slots): past the break-even, the finished values a fixed step still
# feeds cost more than CUDA graphs save. The baseline (one token a row) was faster fixed at each size.
PACKED_STEP_FLOPS = 3e13
SPANS = ("auto", "on", "off")  # DecodeConfig.spans; auto: on where the model runs on a CPU
# DecodeConfig.compile_layers; auto: on CUDA for large bodies, on a CPU in bf16 (hpd_core/compiled.py)
COMPILE_LAYERS = ("auto", "on", "off")
# "auto" compiles the layers' pieces on CUDA for models with at least this many body parameters
# (runner.body_parameters). On an H200 Qwen3-8B's shape (7.0B) ran HPD 1.17x faster compiled (session
# 34); the default model (0.1B), whose steps replay from CUDA graphs with eager pieces, spent 5.08 s
# busy decoding the 491 OA-Mine test products compiled against 3.18 s eager (session 35). On a CPU
# "auto" compiles the element-wise pieces alone in bfloat16 (CompiledLayers.for_cpu, session 44).
COMPILE_MIN_BODY_PARAMETERS = 1_000_000_000
ATTENTION = ("sdpa", "flex_attention", "eager")
DEFAULT_MODEL = "default"  # Gemma 3 270M base + the shipped HPD LoRA adapter, see models.py
DEFAULT_BASE_MODEL = "default-base"  # the same Gemma 3 270M base without the adapter (zero-shot)


@dataclass(frozen=True)
class DecodeConfig:
    """How requests are decoded.

    max_value_tokens: K_max, the position gap after each key and the longest value in tokens.
    batch_token_budget: a batch holds prompts while  rows x (longest prompt + K_max x most slots)
        stays within this many tokens (the size of the KV cache the batch can reach). 0 (the
        default) sizes it for the device when the decoder is built (batching.token_budget):
        65536 on a CPU; on a GPU as many tokens as half the memory then free holds as keys and
        values, at least 65536 (an H200 ran the long benchmark 1.2-1.4x faster at 262144 than at
        65536). It changes speed, not results.
    max_batch_size: at most this many prompts per batch, whatever the budget.
    prefill_tokens: a session's prefill runs in forwards of at most this many new tokens (whole
        prompts; a longer prompt is a forward of its own). 0 (the default) sizes it for the device
        (batching.prefill_tokens): PREFILL_TOKENS_CPU on a CPU, where a forward over thousands of
        tokens at once spends more on memory than on arithmetic (its element-wise steps run out of
        cache), no limit on a GPU. It changes speed, not results.
    skeleton: where HPD's keys go: "interleaved" (each product's text is followed by its own keys;
        the shipped adapter's) or "after-products" (the skeleton follows all J products of the
        prompt). Use a model with the skeleton it was fine-tuned on. The baseline always writes the
        whole answer after the products.
    temperature: 0 is greedy; > 0 samples (with top_p) from a generator seeded with ``seed``.
    step_shape: "packed" (only the tokens still being generated are computed, each row's
        appended after its own cache entries: a CPU, where every computed token costs), "fixed"
        (every row feeds all its slots every step at fixed cache places: the same shapes and no host
        synchronisation from step to step, what a GPU's CUDA graphs or compiler want), or "auto"
        (fixed on CUDA, packed otherwise; on CUDA an HPD batch whose fixed step would reach
        ``PACKED_STEP_FLOPS`` of matrix work is packed: there the finished values a fixed step
        feeds cost more than graphs save). Both give the same tokens.
    check_every: fixed steps only: steps between the host reads that find finished prompts.
    prefix_cache: shared prompt prefixes (a category's instructions and attribute list) whose
        keys and values a decoder keeps for reuse across batches; 0 turns prefix sharing off.
    cuda_graphs: fixed steps on CUDA are recorded once per batch as a CUDA graph and replayed
        (hpd_core/graphs.py): greedy decoding without spans; elsewhere the steps run as they are.
        On by default: on an H200 (session 28) the baseline ran 2.7-3.3x faster with graphs and
        HPD 1.1-1.4x, the same tokens (tests/hpd_core/test_graphs.py).
    cudnn_attention: let PyTorch's SDPA use cuDNN's attention kernels in the engine's forwards
        (hpd_core/attention.py). Off by default: on Hopper GPUs PyTorch prefers cuDNN, which builds
        an execution plan for each new attention shape (tens to hundreds of milliseconds, cached
        without limit), and the engine's shapes change with every batch. It changes speed (and,
        in 16-bit, rounding), not what is asked.
    compile_layers: each decoder layer's MLP, RMS norms and rotary embedding run through
        ``torch.compile`` in the engine's forwards (hpd_core/compiled.py): "on", "off", or "auto"
        (on CUDA, for models of at least COMPILE_MIN_BODY_PARAMETERS body parameters; on a CPU, in
        bfloat16). On an H200 HPD's timed run at 512 long products (Qwen3-8B's shape) ran 1.17x
        faster with the MLPs and norms compiled, with the same values (session 34; the rotary
        embedding joined later); the small default model's job of 491 products decoded slower
        compiled (session 35). On a CPU only the element-wise work is compiled, from 64 tokens a
        call, the tanh GELU as x * sigmoid(2u) (``CompiledLayers.for_cpu``): HPD's prefills on the
        2-core CPU 6-9% faster, its timed run 5% (session 44). Compiling takes seconds once per
        process; steps recorded as CUDA graphs keep their eager pieces. It changes speed (and, in
        16-bit, rounding), not what is asked.
    spans: span decoding (hpd_core/spans.py): every value is a span of its own product's text, a
        token that would leave it is never chosen, and the LM head is computed for the allowed
        tokens only (HPD, the baseline, the reference). "on", "off" (the engine's default: decode
        what the model writes), or "auto" (on where the model runs on a CPU, off on CUDA; what
        ``hpd extract`` and ``hpd bench`` pass): on the 2-core CPU it decoded the default model's
        OA-Mine and AE-110k test sets 1.21x and 1.24x faster (busy decoding seconds, J = 4, run
        back to back) and scored as without it (session 40, README Quality); on CUDA it reads each step's tokens back to the host and its steps are
        not replayed from CUDA graphs. It changes results: a value that would leave the text
        comes out as the span the model prefers.
    confidence: give every value its probability under the model (``types.Value.confidence``; HPD
        and its reference, not the baseline). Off by default: on, each step also sums the LM
        head's probabilities (over the span rule's tokens alone with span decoding).
    """

    max_value_tokens: int = 30
    batch_token_budget: int = 0
    max_batch_size: int = 64
    prefill_tokens: int = 0
    skeleton: str = "interleaved"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    step_shape: str = "auto"
    check_every: int = 4
    prefix_cache: int = 32
    spans: str = "off"
    cuda_graphs: bool = True
    cudnn_attention: bool = False
    compile_layers: str = "auto"
    confidence: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_value_tokens, int) or not 1 <= self.max_value_tokens <= 1024:
            raise ValueError(f"max_value_tokens must be an int in 1..1024, got {self.max_value_tokens!r}")
        if not isinstance(self.batch_token_budget, int) or self.batch_token_budget < 0:
            raise ValueError(f"batch_token_budget must be an int >= 0 (0: sized for the device), got {self.batch_token_budget!r}")
        if not isinstance(self.prefill_tokens, int) or self.prefill_tokens < 0:
            raise ValueError(f"prefill_tokens must be an int >= 0 (0: sized for the device), got {self.prefill_tokens!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.skeleton not in SKELETONS:
            raise ValueError(f"skeleton must be one of {SKELETONS}, got {self.skeleton!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.step_shape not in STEP_SHAPES:
            raise ValueError(f"step_shape must be one of {STEP_SHAPES}, got {self.step_shape!r}")
        if self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be a bool, got {self.cuda_graphs!r}")
        if not isinstance(self.cudnn_attention, bool):
            raise ValueError(f"cudnn_attention must be a bool, got {self.cudnn_attention!r}")
        if not isinstance(self.confidence, bool):
            raise ValueError(f"confidence must be a bool, got {self.confidence!r}")
        if self.spans not in SPANS:
            raise ValueError(f"spans must be one of {SPANS}, got {self.spans!r}")
        if self.compile_layers not in COMPILE_LAYERS:
            raise ValueError(f"compile_layers must be one of {COMPILE_LAYERS}, got {self.compile_layers!r}")
        if self.prefix_cache < 0:
            raise ValueError(f"prefix_cache must be >= 0, got {self.prefix_cache}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def compiles(self, device, body_parameters: int, dtype=None) -> bool:
        """Whether the layers' MLPs, norms and rotary embeddings of a model with this many body
        parameters (``runner.body_parameters``) in ``dtype`` (a torch dtype or its name) are
        compiled on ``device`` (see ``compile_layers``)."""
        if self.compile_layers == "auto":
            if str(device).startswith("cuda"):
                return body_parameters >= COMPILE_MIN_BODY_PARAMETERS
            return str(device) == "cpu" and str(dtype).removeprefix("torch.") == "bfloat16"  # float32 stays eager
        return self.compile_layers == "on"

    def span_decoding(self, device) -> bool:
        """Whether values are decoded as spans of their product's text on ``device`` (see ``spans``)."""
        if self.spans == "auto":
            return not str(device).startswith("cuda")
        return self.spans == "on"

    def fixed_steps(self, device, step_flops: float = 0.0) -> bool:
        """Whether decode steps have fixed shapes on ``device`` (see ``step_shape``), for a batch
        whose fixed step would do ``step_flops`` of matrix work (0: unknown or small)."""
        if self.step_shape == "auto":
            return str(device).startswith("cuda") and step_flops < PACKED_STEP_FLOPS
        return self.step_shape == "fixed"


@dataclass(frozen=True)
class ModelConfig:
    """Which model to load and how.

    name: "default" (the embedded Gemma 3 270M base with its shipped HPD fine-tuned LoRA
        adapter), "default-base" (the same model without it), another embedded name
        (models.EMBEDDED), a hub id, a local directory, or a path to a .gguf file. (An s3:// prefix
        is resolved to a local directory by the pipeline before it reaches the engine; the engine
        never talks to S3.)
    adapter: optional PEFT (LoRA) adapter directory applied on top (for "default" and the other
        embedded names with an adapter it replaces the shipped one: adapters are trained on the
        base model).
    quantization: None or "nf4" (4-bit NF4 weights via bitsandbytes, on CUDA or CPU).
    """

    name: str = DEFAULT_MODEL
    adapter: str | None = None
    dtype: str = "float32"
    device: str = "cpu"
    attention: str = "sdpa"
    quantization: str | None = None
    trust_remote_code: bool = False
    cache_dir: str | None = None  # default: $HPD_CACHE_DIR or ~/.cache/hpd-ave

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("model name must be a non-empty string")
        if self.name.startswith("s3://"):
            raise ValueError(
                f"model {self.name!r} is an S3 prefix: resolve it to a local directory first "
                "(pipelines.artifacts.resolve_model_path)"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.quantization not in (None, "nf4"):
            raise ValueError(f"quantization must be None or 'nf4', got {self.quantization!r}")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")


FINETUNE_DECODERS = ("hpd", "ar")
# The learning rates the recipe search chose on the default's base by validation loss, 5-epoch
# schedule (docs/quality.md): LoRA rank 64 at 2.5e-4 (the shipped default's), the full body at 2e-5.
DEFAULT_LORA_LR = 2.5e-4
DEFAULT_FULL_LR = 2e-5


@dataclass(frozen=True)
class TrainConfig:
    """How to fine-tune.

    docs_per_prompt, max_docs_per_prompt: each training prompt draws J, its number of products,
        uniformly from docs_per_prompt..max_docs_per_prompt (default 1..8: the model learns where a
        product ends whatever J extraction uses); max_docs_per_prompt None: always docs_per_prompt.
    The defaults are the recipe of the shipped default adapter (README, Quality).
    skeleton: where HPD's keys go (DecodeConfig.skeleton); extraction must use the same.
    full: full fine-tuning of the body (every weight but the token embeddings and the LM head,
        which stay frozen unless ``train_embeddings``); else LoRA on every linear projection.
    autocast: "bfloat16" runs forward and backward in bf16 autocast with float32 master weights
        (about 3x faster on CPUs with AVX-512 BF16 or AMX, and on GPUs); None: the model's dtype.
    checkpoint_minutes: with a checkpoint directory, save the whole training state this often
        (and at each epoch's end); ``train(..., resume=True)`` continues from the last one with the
        same result as an uninterrupted run.
    max_value_tokens: K_max, the position gap; gold values longer than this are cut (collate.py).
    lr: None picks DEFAULT_LORA_LR or DEFAULT_FULL_LR.
    grad_accum: micro-batches per optimizer step; ``max_steps`` caps optimizer steps (smoke runs).
    warmup_ratio: fraction of the optimizer steps with linearly rising LR; then linear decay to 0.
    shuffle_attributes: the share of training prompts (drawn per prompt and epoch) that ask for a
        random non-empty subset of their category's attributes in a random order
        (``collate.shuffle_schema``); 0: every prompt asks for its category's list as it is.
    """

    docs_per_prompt: int = 1
    max_docs_per_prompt: int | None = 8
    decoder: str = "hpd"
    skeleton: str = "interleaved"
    max_value_tokens: int = DecodeConfig().max_value_tokens
    full: bool = False
    train_embeddings: bool = False
    lora_rank: int = 64
    lora_alpha: int = 128
    lora_dropout: float = 0.05
    lr: float | None = None
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    max_grad_norm: float = 1.0
    batch_size: int = 1
    grad_accum: int = 4
    epochs: int = 5
    max_steps: int | None = None
    seed: int = 0
    log_every: int = 10
    gradient_checkpointing: bool = False
    autocast: str | None = None
    checkpoint_minutes: float = 5.0
    shuffle_attributes: float = 0.0

    def __post_init__(self) -> None:
        if self.decoder not in FINETUNE_DECODERS:
            raise ValueError(f"decoder must be one of {FINETUNE_DECODERS}, got {self.decoder!r}")
        DecodeConfig(max_value_tokens=self.max_value_tokens, skeleton=self.skeleton)  # as decoding
        if self.max_docs_per_prompt is not None and not (
            isinstance(self.max_docs_per_prompt, int) and self.max_docs_per_prompt >= self.docs_per_prompt
        ):
            raise ValueError(f"max_docs_per_prompt must be an int >= docs_per_prompt, got {self.max_docs_per_prompt!r}")
        if self.autocast not in (None, "bfloat16"):
            raise ValueError(f"autocast must be None or 'bfloat16', got {self.autocast!r}")
        if not self.checkpoint_minutes > 0:
            raise ValueError(f"checkpoint_minutes must be > 0, got {self.checkpoint_minutes}")
        positive = ("docs_per_prompt", "lora_rank", "batch_size", "grad_accum", "epochs", "log_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not self.max_grad_norm > 0:  # clipping to a norm of 0 would zero every gradient
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if not 0 <= self.shuffle_attributes <= 1:
            raise ValueError(f"shuffle_attributes must be in [0, 1], got {self.shuffle_attributes}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay}")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return self.lr
        return DEFAULT_FULL_LR if self.full else DEFAULT_LORA_LR
