"""HPD-aligned fine-tuning (and the baseline's, for a fair comparison): LoRA or full, one device.

``train`` re-stacks the training products into prompts every epoch (new shuffle, same J), turns
them into features with the decoder's collator (collate.py), and runs AdamW with linear warmup and
decay. The loss is the mean cross-entropy over label tokens of an optimizer step (micro-batches x
gradient accumulation), computed from hidden states gathered at label positions, so the LM head
never runs on prompt tokens. Validation loss (held-out products, fixed stacking) is measured before
training and after every epoch. torch + transformers + peft only: no Ray, no S3.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from hpd_core.collate import IGNORE, Example, Features, Labeled, collate, features, shuffle_schema, stack_examples
from hpd_core import attribute_groups, checkpoint, masks
from hpd_core.config import TrainConfig  # the recipe (a config: hpd_core/config.py)
from hpd_core.layout import INTERLEAVED, build_layout
from hpd_core.lora_merge import plain_lora
from hpd_core.types import Attribute

log = logging.getLogger(__name__)

LORA_TARGETS = "all-linear"  # every attention and MLP projection; never the LM head


@dataclass
class TrainReport:
    """What happened: losses per optimizer step, validation loss before training and per epoch."""

    steps: int = 0
    epochs: float = 0.0
    examples_per_epoch: list[int] = field(default_factory=list)  # training prompts of each epoch
    steps_per_epoch: list[int] = field(default_factory=list)  # optimizer steps of each epoch
    planned_steps: int = 0  # what the learning-rate schedule spans: every epoch's steps (or max_steps)
    train_losses: list[float | None] = field(default_factory=list)  # None: an empty step (empty_steps)
    val_losses: list[float | None] = field(default_factory=list)
    tokens: int = 0  # input tokens processed (no padding)
    label_tokens: int = 0
    truncated_slots: int = 0  # HPD gold values cut at K_max (first epoch)
    empty_steps: int = 0  # optimizer steps with no label (unscored values only), skipped: the schedule still counts them
    seconds: float = 0.0
    stopped: bool = False  # ended early (stop_after_steps / stop_after_epoch), resumable from its checkpoint

    @property
    def seconds_per_step(self) -> float | None:
        return self.seconds / self.steps if self.steps else None


def prepare_model(model, config: TrainConfig, init_adapter: str | None = None):
    """Wrap with LoRA (or unfreeze everything for full fine-tuning) and switch to train mode.

    ``init_adapter``: a LoRA adapter directory to start from instead of a fresh LoRA (continue a
    trained adapter, e.g. the shipped one, on other data): a plain LoRA adapter of the config's rank
    and alpha (``check_init_adapter``), whose target modules are kept; ``config.lora_dropout``
    applies.
    """
    torch.manual_seed(config.seed)  # LoRA initialisation
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if init_adapter is not None:
        model = _load_init_adapter(model, init_adapter, config)
    elif config.full:
        frozen = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
        for p in model.parameters():
            p.requires_grad_(config.train_embeddings or id(p) not in frozen)
    else:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=LORA_TARGETS,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    model.train()
    return model


def adapter_shape(path: str | Path) -> dict[str, int]:
    """``lora_rank`` and ``lora_alpha`` of an adapter to start from; a ValueError unless it is a
    local plain LoRA adapter (LoRA factors only, as ``lora_merge.plain_lora`` defines it: no
    biases, DoRA, rsLoRA, per-layer ranks or saved modules), or one saying the path does not exist."""
    if not Path(path).exists():
        raise ValueError(f"adapter to start from {path} does not exist (pass an adapter's directory, as `hpd finetune --out` writes it)")
    if not (Path(path) / "adapter_config.json").is_file():
        raise ValueError(f"adapter to start from {path} is not a PEFT adapter directory (no adapter_config.json)")
    saved = plain_lora(path)
    if saved is None:
        raise ValueError(
            f"adapter to start from {path} is not a plain LoRA adapter (LoRA factors only: no biases, DoRA, "
            "rsLoRA, per-layer ranks or saved modules; hpd_core/lora_merge.py)"
        )
    return {"lora_rank": saved["r"], "lora_alpha": saved["lora_alpha"]}


def check_init_adapter(path: str | Path, config: TrainConfig) -> None:
    """A ValueError, naming what differs, unless the run is LoRA and ``path`` is a plain LoRA
    adapter (``adapter_shape``) of its rank and alpha."""
    if config.full:
        raise ValueError("an adapter to start from is for LoRA runs: full fine-tuning starts from the model's weights")
    shape = adapter_shape(path)
    if shape != {"lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha}:
        raise ValueError(
            f"adapter to start from {path} has LoRA rank {shape['lora_rank']} and alpha {shape['lora_alpha']}, "
            f"the run {config.lora_rank} and {config.lora_alpha}: set the run's to the adapter's"
        )


def _load_init_adapter(model, path: str, config: TrainConfig):
    """``model`` with a trainable LoRA of the adapter's config (checked; the run's dropout), its
    weights float32 (peft's default ``autocast_adapter_dtype``) and set to the adapter's. An adapter
    trained on another base is refused: a tensor of another shape, one no layer of the model takes,
    or a LoRA layer of the model the adapter has no weights for."""
    from peft import LoraConfig, get_peft_model
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    check_init_adapter(path, config)
    lora = LoraConfig.from_pretrained(path)
    lora.lora_dropout, lora.inference_mode = config.lora_dropout, False
    model = get_peft_model(model, lora)
    try:
        loaded = set_peft_model_state_dict(model, load_file(str(Path(path) / "adapter_model.safetensors")))
    except RuntimeError as err:  # sizes that differ: name the first
        first = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line), str(err))
        raise ValueError(f"adapter to start from {path} does not fit the model (trained on another base?): {first}") from err
    missing = [k for k in loaded.missing_keys if "lora_" in k]
    if loaded.unexpected_keys or missing:
        raise ValueError(
            f"adapter to start from {path} does not fit the model (trained on another base?): "
            f"{len(loaded.unexpected_keys)} of its tensors fit no layer of the model (e.g. "
            f"{loaded.unexpected_keys[:1]}), {len(missing)} LoRA weights of the model are not in it (e.g. {missing[:1]})"
        )
    return model


def token_losses(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy (N,) at every label position of the batch (row-major order).

    Runs the transformer body with the batch's explicit positions and 4D mask, then the LM head on
    the label positions only (with the model's final logit soft-capping, if any).
    """
    body, head = model.get_decoder(), model.get_output_embeddings()
    device = head.weight.device
    hidden = body(
        input_ids=batch["input_ids"].to(device),
        position_ids=batch["position_ids"].to(device),
        attention_mask=_to(batch["attention_mask"], device),
        use_cache=False,
    ).last_hidden_state  # (B, T, H)
    labels = batch["labels"].to(device)
    keep = labels != IGNORE
    logits = head(hidden[keep]).float()  # (N, V)
    softcap = getattr(model.config, "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, labels[keep], reduction="none")


def _to(mask, device):
    """A mask, or a mapping of masks by layer type, on ``device``."""
    return {k: v.to(device) for k, v in mask.items()} if isinstance(mask, dict) else mask.to(device)


def collate_for(model, tokenizer, group: Sequence[Features]) -> dict:
    """``collate`` with the model's pad id, mask dtype and per-layer attention windows."""
    return collate(group, tokenizer.pad_token_id, mask_dtype(model), masks.layer_windows(model.config))


def mask_dtype(model) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


def batches(feats: Sequence[Features], batch_size: int) -> list[list[Features]]:
    return [list(feats[i : i + batch_size]) for i in range(0, len(feats), batch_size)]


@torch.no_grad()
def mean_loss(model, tokenizer, feats: Sequence[Features], batch_size: int) -> float | None:
    """Mean token loss over ``feats`` (eval mode); None when there is nothing to score."""
    if not feats:
        return None
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for group in batches(feats, batch_size):
        losses = token_losses(model, collate_for(model, tokenizer, group))
        total += float(losses.sum())
        count += losses.numel()
    model.train(was_training)
    return total / count if count else None


def to_features(tokenizer, examples: Sequence[Example], config: TrainConfig) -> list[Features]:
    return [features(tokenizer, ex, config.decoder, config.max_value_tokens, config.skeleton) for ex in examples]


Widen = Callable[[Example], list[Example]]


def _stack(products, attributes, config: TrainConfig, rng: random.Random, widen: Widen | None = None,
           training: bool = True) -> list[Example]:
    """An epoch's training prompts (``training``: with ``config.shuffle_attributes``, that share of
    them drawn over shuffled subsets of their attributes), or the validation prompts (never)."""
    examples = stack_examples(products, attributes, config.docs_per_prompt, rng, config.max_docs_per_prompt)
    if training and config.shuffle_attributes:
        examples = [shuffle_schema(ex, rng) if rng.random() < config.shuffle_attributes else ex for ex in examples]
    return examples if widen is None else [part for example in examples for part in widen(example)]


def widener(model, tokenizer, config: TrainConfig) -> Widen | None:
    """HPD's training prompts too wide for the model's sliding window, as prompts over groups of
    their attributes, as the engine decodes them (hpd_core/attribute_groups.py); None where no
    prompt can be (the baseline, the after-products skeleton, a model without sliding layers)."""
    window = masks.smallest_window(model.config)
    if config.decoder != "hpd" or config.skeleton != INTERLEAVED or window is None:
        return None

    def widen(example: Example) -> list[Example]:
        layout = build_layout(example.request, tokenizer, config.max_value_tokens, config.skeleton)
        return attribute_groups.split_example(example, layout, window)

    return widen


def plan_epochs(products, attributes, config: TrainConfig, rng_state, widen: Widen | None = None) -> list[int]:
    """The number of training prompts of each epoch. With a mix of J each epoch stacks the products
    anew, so epochs differ in length; the learning-rate schedule must span their sum. Replays, from
    the run's starting random state, exactly what ``train`` draws per epoch: the stacking, then a
    shuffle of that many prompts (a shuffle's draws depend only on the length)."""
    rng = random.Random()
    rng.setstate(rng_state)
    counts = []
    for _ in range(config.epochs):
        n = len(_stack(products, attributes, config, rng, widen))
        rng.shuffle(list(range(n)))
        counts.append(n)
    return counts


def steps_for(prompts: int, config: TrainConfig) -> int:
    """Optimizer steps of an epoch of ``prompts`` training prompts (the last step may be partial)."""
    return math.ceil(math.ceil(prompts / config.batch_size) / config.grad_accum)


def _join(values: Sequence[int]) -> str:
    return ", ".join(map(str, values))


def _autocast(model, config: TrainConfig):
    device = model.get_output_embeddings().weight.device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=config.autocast == "bfloat16")


def schedule(optimizer, total_steps: int, warmup_ratio: float):
    warmup = math.ceil(warmup_ratio * total_steps)

    def factor(step: int) -> float:  # step = optimizer steps taken so far
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train(
    model,
    tokenizer,
    train_products: Sequence[Labeled],
    val_products: Sequence[Labeled],
    attributes: dict[str, tuple[Attribute, ...]],
    config: TrainConfig,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    stop_after_steps: int | None = None,
    stop_after_epoch: int | None = None,
    on_epoch_end: Callable[[int, TrainReport], None] | None = None,
) -> TrainReport:
    """Fine-tune ``model`` (already passed through ``prepare_model``) in place; return the report.

    With ``checkpoint_dir`` the whole training state is saved there every
    ``config.checkpoint_minutes`` and at each epoch's end (checkpoint.py); ``resume`` continues
    from it. ``stop_after_steps`` ends the run after that many optimizer steps, checkpointed, as an
    interruption would (tests; a resumed run then finishes the same schedule); ``stop_after_epoch``
    likewise after that epoch (validated, checkpointed and passed to ``on_epoch_end``): a long run in
    sittings, or several learning rates compared after one epoch of the same schedule before the
    best is continued. A stopped run's report has ``stopped`` set.
    ``on_epoch_end(n, report)`` runs after epoch ``n`` (1-based) is validated and checkpointed, with
    the model in that epoch's state (e.g. to save each epoch's adapter for selection on validation).
    """
    if not train_products:
        raise ValueError("no training products: check the training data and --val-fraction")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)  # dropout
    widen = widener(model, tokenizer, config)
    val_examples = _stack(val_products, attributes, config, random.Random(config.seed), widen, training=False)
    val_feats = to_features(tokenizer, val_examples, config)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=config.weight_decay)

    report = TrainReport()
    epoch_rng_state = rng.getstate()  # stacking and shuffling of an epoch replay from this
    examples_per_epoch = plan_epochs(train_products, attributes, config, rng_state=epoch_rng_state, widen=widen)
    steps_per_epoch = [steps_for(n, config) for n in examples_per_epoch]
    total = sum(steps_per_epoch) if config.max_steps is None else min(sum(steps_per_epoch), config.max_steps)
    scheduler = schedule(optimizer, total, config.warmup_ratio)
    start_epoch, start_micro = 0, 0
    state = checkpoint.load(checkpoint_dir) if resume and checkpoint_dir is not None else None
    if state is not None:
        start_epoch, start_micro, epoch_rng_state = checkpoint.restore(state, model, optimizer, scheduler, report)
        if report.examples_per_epoch and report.examples_per_epoch != examples_per_epoch:
            raise ValueError(f"the checkpoint in {checkpoint_dir} was planned as {_join(report.examples_per_epoch)} "
                             f"training prompts per epoch, and this version plans {_join(examples_per_epoch)}: it "
                             "lays the prompts out otherwise (since 2026-11-30 a prompt wider than the model's "
                             "sliding window trains as attribute groups), so resuming would train another schedule; "
                             "finish the run with the version that started it, or start it over")
        log.info("resumed at step %d (epoch %d, micro-batch %d)", report.steps, start_epoch, start_micro)
    else:
        report.val_losses.append(mean_loss(model, tokenizer, val_feats, config.batch_size))
    report.examples_per_epoch, report.steps_per_epoch, report.planned_steps = examples_per_epoch, steps_per_epoch, total
    log.info("%s training prompts and %s optimizer steps per epoch, %d steps; val loss %s",
             _join(report.examples_per_epoch), _join(report.steps_per_epoch), total, _fmt(report.val_losses[0]))

    last_save = time.monotonic()

    def save_state(epoch: int, micro_index: int, rng_state) -> None:
        nonlocal last_save
        if checkpoint_dir is not None:
            checkpoint.save(checkpoint_dir, model, optimizer, scheduler, report, epoch, micro_index, rng_state)
            last_save = time.monotonic()

    window_tokens, window_seconds, window_steps = 0, 0.0, 0  # for the progress line; validation time excluded
    for epoch in range(start_epoch, config.epochs):
        if report.steps >= total:
            break
        if epoch != start_epoch:
            epoch_rng_state = rng.getstate()
        rng.setstate(epoch_rng_state)  # a resumed epoch replays its stacking and shuffle
        examples = _stack(train_products, attributes, config, rng, widen)
        feats = to_features(tokenizer, examples, config)
        if epoch == 0:
            report.truncated_slots = sum(f.truncated_slots for f in feats)
        rng.shuffle(feats)
        micro = batches(feats, config.batch_size)
        if len(feats) != report.examples_per_epoch[epoch]:  # plan_epochs replays exactly this
            raise RuntimeError(f"epoch {epoch + 1} has {len(feats)} prompts, planned {report.examples_per_epoch[epoch]}")
        first_micro = start_micro if epoch == start_epoch else 0
        for first_micro in range(first_micro, len(micro), config.grad_accum):
            group = micro[first_micro : first_micro + config.grad_accum]
            step_start = time.perf_counter()
            n_labels = sum(f.num_labels for b in group for f in b)
            step_loss = 0.0
            step_lr = scheduler.get_last_lr()[0]  # the rate this step trains at (logged below)
            if n_labels:
                for b in group:
                    with _autocast(model, config):
                        losses = token_losses(model, collate_for(model, tokenizer, b))
                        loss = losses.sum() / n_labels
                    loss.backward()
                    step_loss += float(loss.detach())
                    tokens = sum(len(f.input_ids) for f in b)
                    window_tokens += tokens
                    report.tokens += tokens
                report.label_tokens += n_labels
                torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
                optimizer.step()
            else:  # prompts of unscored values only (a teacher's floor): nothing to learn, so the weights stay
                report.empty_steps += 1  # (AdamW would move them on its momentum and weight decay); the schedule goes on
            with warnings.catch_warnings():  # torch warns of a schedule step with no optimizer step before it: meant
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
                scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            elapsed = time.perf_counter() - step_start
            report.seconds += elapsed
            window_seconds += elapsed
            report.steps += 1
            window_steps += 1
            report.train_losses.append(step_loss if n_labels else None)
            report.epochs = epoch + (first_micro + len(group)) / len(micro)
            if report.steps % config.log_every == 0 or report.steps == total:
                log.info("step %d/%d epoch %.2f loss %s lr %.2e %.0f tokens/s %.2f s/step, %s to go",
                         report.steps, total, report.epochs, _fmt(report.train_losses[-1]), step_lr,
                         window_tokens / window_seconds, report.seconds / report.steps,
                         remaining(total - report.steps, window_seconds / window_steps))
                window_tokens, window_seconds, window_steps = 0, 0.0, 0
            next_micro = first_micro + len(group)
            if report.steps >= total:
                break
            if stop_after_steps is not None and report.steps >= stop_after_steps:
                save_state(epoch, next_micro, epoch_rng_state)
                report.stopped = True
                return report
            if time.monotonic() - last_save >= 60 * config.checkpoint_minutes and next_micro < len(micro):
                save_state(epoch, next_micro, epoch_rng_state)
        report.val_losses.append(mean_loss(model, tokenizer, val_feats, config.batch_size))
        log.info("epoch %.2f done: val loss %s", report.epochs, _fmt(report.val_losses[-1]))
        save_state(epoch + 1, 0, rng.getstate())
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, report)
        if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch and epoch + 1 < config.epochs:
            report.stopped = True
            break
    model.eval()
    return report


def remaining(steps: int, seconds_per_step: float) -> str:
    """The time ``steps`` more steps take at the recent pace, as the progress line shows it."""
    minutes = round(steps * seconds_per_step / 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def save(model, tokenizer, out_dir: Path, full: bool) -> None:
    """LoRA: the adapter (``load_model(ModelConfig(name=base, adapter=out_dir))``); full: the whole
    model and tokenizer (``ModelConfig(name=out_dir)``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    if full:
        tokenizer.save_pretrained(out_dir)
    readable(out_dir)


def readable(folder: Path) -> None:
    """The files of ``folder`` with the usual permissions (0644 under umask 022): safetensors writes
    its files through a private temporary file (0600), which others who run the jobs could not read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~umask)
