"""`hpd finetune`: HPD-aligned (or baseline) fine-tuning on gold values or a teacher's output.

    hpd finetune --train DIR --out ADAPTER [--decoder hpd|ar] [--teacher EXTRACT_OUTPUT] ...

``--train`` is an ``hpd convert`` directory (records.jsonl, attributes.json, gold.jsonl) or a
records file (JSONL/Parquet; ``--attributes`` and ``--gold`` default to the files beside it). With
``--teacher URI`` the targets are the teacher's ``attributes/`` output instead of gold
(distillation). Products are held out for validation (``--val-fraction``), the rest are stacked J
per prompt (by default a mix of J = 1..8 per prompt; ``--docs-per-prompt``, ``--max-docs-per-prompt``;
the same for both decoders). The adapter (or, with
``--full``, the whole model) is saved in ``--out`` with ``training_config.json``; load it with
``ModelConfig(name=MODEL, adapter=OUT)`` (``hpd extract --adapter OUT``).

Training defaults live in ``hpd_core.config.TrainConfig``; options left unset here take them.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from datafiles.dataset import ATTRIBUTES_FILE
from jobs.quiet import log_to_stderr, quiet_libraries
from hpd_core.config import (
    ATTENTION, DEFAULT_BASE_MODEL, DEFAULT_FULL_LR, DEFAULT_LORA_LR, DTYPES, SKELETONS, DecodeConfig, ModelConfig, TrainConfig,
)

CONFIG_FILE = "training_config.json"
EPOCH_FILE = "epoch.json"  # in OUT/epoch-N/ with --save-epochs: epoch, optimizer steps, validation loss
DEFAULT_VAL_FRACTION = 0.1
TRAIN_DEFAULTS = TrainConfig()  # the defaults the help texts name
INTERRUPTED = ("the same command with --resume continues from the last checkpoint (OUT/checkpoint/, saved every "
               "--checkpoint-minutes; before the first one, the same command without --resume starts over)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument("--train", type=Path, required=True, help="hpd convert directory or records file (.jsonl/.parquet)")
    data.add_argument("--attributes", type=Path, help="attribute schema (default: attributes.json beside the records)")
    data.add_argument("--gold", type=Path, help="gold.jsonl (default: beside the records; not with --teacher)")
    data.add_argument("--teacher", help="distillation: output directory of `hpd extract` (local or s3://), of the "
                                        "records' products or more (a whole catalog's: only the records' are read); "
                                        "replaces gold (no OUT/validation/ is written: its products have no gold)")
    data.add_argument("--min-confidence", type=float, metavar="P",
                      help="with --teacher (an `hpd extract --confidence` output) and --decoder hpd: a teacher value "
                           "below this confidence is fed but is no target, so a catalog trains on its own sure values "
                           "without labels")
    data.add_argument(
        "--val-fraction", type=float, default=DEFAULT_VAL_FRACTION, help="products held out for validation loss (default %(default)s)"
    )
    data.add_argument(
        "--docs-per-prompt", type=int, metavar="J",
        help="products per training prompt: alone, always J; with --max-docs-per-prompt the smallest J of the mix "
             "(default: the mix 1..8 of the shipped recipe)",
    )
    data.add_argument(
        "--examples", type=int, metavar="K",
        help="describe each attribute in the prompts by its K most frequent values among the training products "
             "(not the held-out ones); the schema used is written to OUT/attributes.json: extract with it",
    )
    data.add_argument(
        "--max-value-tokens", type=int, default=DecodeConfig().max_value_tokens, help="K_max (default %(default)s, as extraction)"
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        default=DEFAULT_BASE_MODEL,
        help=f"base model: '{DEFAULT_BASE_MODEL}' (Gemma 3 270M base, default), 'smollm2-135m', hub id, local dir or .gguf",
    )
    model.add_argument(
        "--init-adapter",
        metavar="ADAPTER",
        help="start the LoRA from this adapter (a directory, or 'default' for the default model's shipped one) "
             "instead of from zero: continue it on your own data; the run takes its rank and alpha",
    )
    model.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default %(default)s)")
    model.add_argument("--dtype", choices=DTYPES, default=ModelConfig().dtype, help="weights dtype (default %(default)s)")
    model.add_argument("--attention", choices=[a for a in ATTENTION if a != "flex_attention"], default="sdpa",
                       help="attention implementation (default sdpa)")
    model.add_argument("--out", type=Path, required=True, help="a new or empty folder for the adapter and training_config.json (with --resume: the stopped run's)")
    train = parser.add_argument_group("training (unset options take hpd_core.config.TrainConfig defaults)")
    train.add_argument("--decoder", choices=["hpd", "ar"], default="hpd", help="training view: hpd (default) or ar baseline")
    train.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    train.add_argument("--lora-rank", type=int, help=f"LoRA rank (default {TRAIN_DEFAULTS.lora_rank})")
    train.add_argument("--lora-alpha", type=int, help=f"LoRA alpha (default {TRAIN_DEFAULTS.lora_alpha})")
    train.add_argument("--lora-dropout", type=float, help=f"LoRA dropout (default {TRAIN_DEFAULTS.lora_dropout})")
    train.add_argument("--lr", type=float, help=f"peak learning rate (default {DEFAULT_LORA_LR:g} LoRA, {DEFAULT_FULL_LR:g} full)")
    train.add_argument("--weight-decay", type=float, help=f"AdamW weight decay (default {TRAIN_DEFAULTS.weight_decay:g})")
    train.add_argument("--warmup-ratio", type=float, help=f"fraction of steps with rising LR (default {TRAIN_DEFAULTS.warmup_ratio})")
    train.add_argument("--max-grad-norm", type=float, help=f"gradient clipping norm (default {TRAIN_DEFAULTS.max_grad_norm:g})")
    train.add_argument("--batch-size", type=int, help=f"prompts per micro-batch (default {TRAIN_DEFAULTS.batch_size})")
    train.add_argument("--grad-accum", type=int, help=f"micro-batches per optimizer step (default {TRAIN_DEFAULTS.grad_accum})")
    train.add_argument("--epochs", type=int, help=f"(default {TRAIN_DEFAULTS.epochs})")
    train.add_argument("--max-steps", type=int, help="stop after this many optimizer steps (smoke runs, timing)")
    train.add_argument("--seed", type=int, help=f"(default {TRAIN_DEFAULTS.seed})")
    train.add_argument("--log-every", type=int, help=f"progress line every N optimizer steps (default {TRAIN_DEFAULTS.log_every})")
    train.add_argument("--gradient-checkpointing", action="store_true", help="trade compute for memory")
    train.add_argument("--max-docs-per-prompt", type=int, metavar="J_MAX",
                       help="train on a mix of J: each prompt draws J from --docs-per-prompt (default 1)..J_MAX")
    train.add_argument("--shuffle-attributes", type=float, metavar="P",
                       help="this share of training prompts asks for a random subset of its category's attributes in "
                            f"a random order, drawn per prompt and epoch (default {TRAIN_DEFAULTS.shuffle_attributes:g})")
    train.add_argument("--skeleton", choices=SKELETONS, help=f"where HPD's keys go (default {TRAIN_DEFAULTS.skeleton}); extract with the same")
    train.add_argument("--train-embeddings", action="store_true", help="with --full, also train the token embeddings / LM head")
    train.add_argument("--autocast", choices=["bfloat16"], help="bf16 autocast with float32 master weights (fast on AVX-512 BF16/AMX CPUs and GPUs)")
    train.add_argument("--checkpoint-minutes", type=float, help=f"save the training state this often (default {TRAIN_DEFAULTS.checkpoint_minutes:g}) in OUT/checkpoint/")
    train.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint/ with the first sitting's options and data (checked; "
                            "same result as an uninterrupted run)")
    train.add_argument("--stop-after-epoch", type=int, metavar="N",
                       help="end this sitting after epoch N, checkpointed; the same command with --resume continues "
                            "the same schedule (a long run in sittings, or learning rates compared after epoch N)")
    train.add_argument("--save-epochs", action="store_true",
                       help="also save each epoch's adapter (or model, with --full) in OUT/epoch-N/, to choose on validation")
    parser.add_argument("--verbose", action="store_true",
                        help="also show what the libraries print: transformers' progress bars (model loading, saving) and "
                             "deprecation warnings, bitsandbytes' notices (hidden by default; hpd's own warnings always show)")


def docs_options(args: argparse.Namespace) -> dict:
    """J of the training prompts: ``--docs-per-prompt J`` alone is always J; with
    ``--max-docs-per-prompt`` (or that alone, from TrainConfig's smallest J) a mix; neither: the
    TrainConfig default mix."""
    if args.docs_per_prompt is None:
        return {} if args.max_docs_per_prompt is None else {"max_docs_per_prompt": args.max_docs_per_prompt}
    return {"docs_per_prompt": args.docs_per_prompt, "max_docs_per_prompt": args.max_docs_per_prompt}


TRAIN_OPTIONS = (
    "decoder", "full", "lora_rank", "lora_alpha", "lora_dropout", "lr", "weight_decay", "warmup_ratio",
    "max_grad_norm", "batch_size", "grad_accum", "epochs", "max_steps", "seed", "log_every",
    "gradient_checkpointing", "skeleton", "train_embeddings", "autocast", "checkpoint_minutes", "shuffle_attributes",
)  # fmt: skip


def init_adapter_dir(args: argparse.Namespace) -> str | None:
    """The directory of ``--init-adapter``: an embedded name's shipped adapter (for a ``--model``
    of the same base) or a directory as given; never ``--out`` itself (the run writes there)."""
    from hpd_core.models import EMBEDDED, bare_model_name, resolve_adapter

    name = args.init_adapter
    if name is None:
        return None
    embedded = EMBEDDED.get(name)
    if embedded is None:
        if Path(name).resolve() == args.out.resolve():
            raise ValueError(f"--init-adapter {name} is --out: the run would overwrite the adapter it starts from")
        return name
    base = EMBEDDED.get(args.model)
    if embedded.adapter is None or base is None or base.package != embedded.package:
        shipped = ", ".join(f"{n} (--model {bare_model_name(n)})" for n, e in EMBEDDED.items() if e.adapter is not None)
        raise ValueError(f"--init-adapter {name}: models that ship an adapter to start from: {shipped}; "
                         "or pass an adapter's directory")
    return resolve_adapter(ModelConfig(name=name))  # the shipped one, or why it is missing


def train_options(args: argparse.Namespace) -> dict:
    """The TrainConfig fields the command line set: those not None, and flags that are on (a 0 is
    a value: ``--warmup-ratio 0`` means no warm-up, not the default)."""
    return {name: value for name in TRAIN_OPTIONS if (value := getattr(args, name)) is not None and value is not False}


RUN_FILE = "run.json"  # in OUT/checkpoint/: what the run's first sitting was asked, for --resume to check
SITTING_OPTIONS = ("resume", "stop_after_epoch", "checkpoint_minutes", "log_every", "save_epochs", "verbose", "func")


def plain_args(args: argparse.Namespace, skip=("func",)) -> dict:
    """The command's options as JSON values (paths as strings), without those in ``skip``."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in skip}


def run_identity(args: argparse.Namespace, data_stats: dict, data_digest: str | None = None) -> dict:
    """What a run's result depends on: its command's options (not those of one sitting:
    ``SITTING_OPTIONS``) and the data it read: its counts and the digest of its content
    (``training.data.digest``)."""
    identity = {"options": plain_args(args, SITTING_OPTIONS), "data": data_stats}
    return identity if data_digest is None else {**identity, "data_digest": data_digest}


def shown_option(key: str, options: dict) -> str:
    """An option of a run as a resume's refusal names it: unset, the value it then takes (the default
    0.00025, not None)."""
    value = options.get(key)
    if value is not None:
        return repr(value)
    if key == "lr":
        return f"the default {DEFAULT_FULL_LR if options.get('full') else DEFAULT_LORA_LR!r}"
    if key in ("lora_rank", "lora_alpha") and options.get("init_adapter"):
        return "unset: the --init-adapter's"
    default = getattr(TRAIN_DEFAULTS, key, None) if key in TRAIN_OPTIONS else None
    return "unset" if default is None else f"the default {default!r}"


# the data's counts that follow from its content: with the same digest, a run.json that counted
# them otherwise (before session 60 the values below a teacher's floor counted too) is the same data
COUNTS_OF_CONTENT = ("targets", "null_targets", "targets_not_in_text", "target_not_in_text_example", "none_words",
                     "none_words_written")  # fmt: skip


def counted(data: dict, same_content: bool) -> dict:
    """The data's counts a resume compares: all of them, or with the first sitting's digest
    matched, those the digest does not already vouch for."""
    return {k: v for k, v in data.items() if not (same_content and k in COUNTS_OF_CONTENT)}


def check_resume(checkpoints: Path, identity: dict) -> None:
    """``--resume`` continues the run in ``checkpoints`` only with the options and data of its
    first sitting: anything else would go on silently with other prompts or another schedule."""
    path = checkpoints / RUN_FILE
    if not path.is_file():
        logging.warning("--resume: %s is missing (a checkpoint from before it was written): options not checked", path)
        return
    first, identity = json.loads(path.read_text(encoding="utf-8")), json.loads(json.dumps(identity))
    flag = lambda key: "--" + key.replace("_", "-")
    differ = [f"{flag(k)} ({shown_option(k, first['options'])} then, {shown_option(k, identity['options'])} now)"
              for k, v in identity["options"].items() if first["options"].get(k) != v]  # fmt: skip
    same_content = "data_digest" in first and first["data_digest"] == identity.get("data_digest")
    if counted(first["data"], same_content) != counted(identity["data"], same_content):
        differ.append(f"the data ({first['data']} then, {identity['data']} now)")
    elif "data_digest" not in first:  # a run.json from before the digest: its counts are all there is to check
        logging.warning("--resume: %s predates the data's digest: only the data's counts are checked, not its "
                        "values (the same records, schema and gold as the first sitting's?)", path)
    elif first["data_digest"] != identity.get("data_digest"):
        differ.append("the data's content (the same counts, other values: a gold value, a record's text or the schema "
                      f"changed; digest {first['data_digest'][:12]} then, {str(identity.get('data_digest'))[:12]} now)")
    if differ:
        raise ValueError(f"--resume: this command differs from the run's first sitting in {', '.join(differ)}: "
                         f"resume with the same options, or start a new run in another --out")  # fmt: skip


def check_out(out: Path, resume: bool) -> None:
    """A new run writes into a new or empty ``--out``: an earlier run's adapter would be overwritten
    and its ``epoch-N/`` and ``validation/`` folders kept beside the new adapter (scoring it on
    products it trained on). ``--resume`` continues the run that is there."""
    if resume:
        return
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: pass a new or empty folder")
    if (out / "checkpoint" / "checkpoint.pt").is_file():
        raise ValueError(f"{out / 'checkpoint'} holds a checkpoint of an earlier run: pass --resume to continue it, "
                         "or choose another --out")
    if out.is_dir() and {p.name for p in out.iterdir()} <= {"checkpoint", VALIDATION_DIR, ATTRIBUTES_FILE} \
            and not any((out / "checkpoint").glob("*.pt")):  # a first sitting that stopped before its first checkpoint
        logging.warning("--out %s holds what a run that stopped before its first checkpoint wrote: starting it over", out)
        return
    if out.is_dir() and (held := sorted(p.name for p in out.iterdir())):
        raise ValueError(f"--out {out} is not empty (it holds {', '.join(held[:5])}{', ...' if len(held) > 5 else ''}: "
                         "an earlier run's?): pass a new or empty folder, or remove that one; --resume continues a "
                         "stopped or interrupted run there")


def split(products: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, validation): a seeded random ``fraction`` of the products is held out."""
    if not 0 <= fraction < 1:
        raise ValueError(f"--val-fraction must be in [0, 1), got {fraction}")
    order = list(range(len(products)))
    random.Random(seed).shuffle(order)
    held = set(order[: round(fraction * len(products))])
    return [p for i, p in enumerate(products) if i not in held], [p for i, p in enumerate(products) if i in held]


VALIDATION_DIR = "validation"


def write_validation(sources, products: list, out: Path, attributes: dict | None = None) -> Path | None:
    """The held-out products as an ``hpd convert`` folder (records, attributes, gold) under
    ``out/validation``, so that a run's checkpoints can be compared with ``hpd extract`` +
    ``hpd evaluate`` on exactly the products it did not train on. The schema is ``attributes`` (the
    one the run trains with) or the source's, written as JSON (the source may be YAML). None when
    nothing is held out."""
    if not products:
        return None
    from datafiles.storage import read_text
    from pipelines.reader import PARQUET_SUFFIXES
    from pipelines.schema import id_of, load_schema, schema_file_text
    from training import data as gold

    ids = {p.product.product_id for p in products}
    folder = out / VALIDATION_DIR
    folder.mkdir(parents=True, exist_ok=True)
    if Path(sources.records).suffix.lower() in PARQUET_SUFFIXES:  # written as JSON lines, what hpd extract reads too
        rows = [r for r in gold.read_records(Path(sources.records)) if isinstance(r, dict) and id_of(r.get("product_id")) in ids]
        (folder / "records.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows), encoding="utf-8")
    for source, name in ((sources.records, "records.jsonl"), (sources.gold, "gold.jsonl")):
        if not Path(source).is_file() or Path(source).suffix.lower() in PARQUET_SUFFIXES:
            continue
        with open(folder / name, "w", encoding="utf-8") as kept:  # the lines as given, gzip or not, uncompressed
            for line in read_text(source).split("\n"):
                value = json.loads(line) if line.strip() else None
                if isinstance(value, dict) and id_of(value.get("product_id")) in ids:  # not an object: a rejected record
                    kept.write(line.rstrip("\r") + "\n")
    attributes = attributes if attributes is not None else load_schema(str(sources.attributes)).categories
    (folder / ATTRIBUTES_FILE).write_text(schema_file_text(attributes), encoding="utf-8")
    return folder


def warn_about_data(stats: dict, sources) -> None:
    """Warn of what in the training data (``training.data``'s stats) the run will not learn as meant."""
    if stats.get("targets_not_in_text"):
        logging.warning(
            "%d of the %d target values are not in their product's text (e.g. %s): `hpd extract` writes "
            "such a value as null, so the model is taught values it may not give; write each value as the "
            "product's title, description or features write it (or add that spelling as another acceptable value)",
            stats["targets_not_in_text"], stats.get("targets", stats["slots"]) - stats["null_targets"],
            stats["target_not_in_text_example"],
        )
    if stats.get("none_words"):
        logging.warning("%d target value(s) are a word for none (%s): they are trained as those words; "
                        'none is written {"n/a": 1} (or the attribute left out)', stats["none_words"], stats["none_words_written"])
    if stats["slots"] and stats["null_targets"] == stats.get("targets", stats["slots"]):
        logging.warning("every one of the %d target values is none (n/a or left out): the run teaches the model to "
                        "find nothing; are these the labels meant?", stats["null_targets"])
    if rejected := stats.get("rejected"):
        logging.warning("%d of the %d records of %s are rejected, as extraction would reject them, and not trained on: %s",
                        sum(rejected.values()), stats["records"], sources.records,
                        "; ".join(f"{n} {reason}" for reason, n in sorted(rejected.items(), key=lambda kv: -kv[1])))
    if stats.get("gold_not_in_records"):
        logging.warning("%d gold line(s) of %s have no record in %s (e.g. %s): their labels are not trained on; "
                        "do records and gold write the same ids?", stats["gold_not_in_records"], sources.gold,
                        sources.records, stats["gold_not_in_records_example"])
    if stats.get("teacher_missing_values"):
        logging.warning("%d of the schema's attribute values are missing from the teacher output (extracted with another "
                        "schema?): each is fed as none%s", stats["teacher_missing_values"],
                        "" if "teacher_values_below_confidence" in stats else " and trained as none")
    if stats.get("gold_category_differs"):
        logging.warning(
            "%d gold line(s) of %s give another category than their record (e.g. %s): they are trained with the "
            "records' category and its attributes, as extraction prompts them; were records and gold made together?",
            stats["gold_category_differs"], sources.gold, stats["gold_category_differs_example"],
        )


def run(args: argparse.Namespace) -> int:
    log_to_stderr("%(asctime)s %(message)s")  # warnings: "<time> warning: ..."
    with quiet_libraries(active=not args.verbose):  # from before the imports: bitsandbytes' notice comes with them
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    import torch

    from hpd_core import finetune, prompts
    from hpd_core.models import bare_model_name, check_device, emulated_dtype_warning, load_model, resolve_dtype
    from training import data as gold
    from training import examples

    if args.teacher is not None and args.gold is not None:
        raise ValueError(f"--gold {args.gold} with --teacher {args.teacher}: the teacher's values replace gold, so "
                         "--gold would be ignored; give one of them")
    if args.min_confidence is not None:
        if args.teacher is None:
            raise ValueError("--min-confidence is for a teacher's values (--teacher OUTPUT): gold values are all targets")
        if not 0 < args.min_confidence <= 1:
            raise ValueError(f"--min-confidence must be in (0, 1], got {args.min_confidence}")
        if args.decoder == "ar":
            raise ValueError("--min-confidence is for --decoder hpd: the baseline's answer is one sequence, whose "
                             "values cannot be left out of the loss one by one")
    if args.stop_after_epoch is not None and not 1 <= args.stop_after_epoch:
        raise ValueError(f"--stop-after-epoch must be a positive int, got {args.stop_after_epoch}")
    bare = bare_model_name(args.model)
    if bare is not None:
        raise ValueError(
            f"--model {args.model} already carries a shipped adapter; adapters are trained on the "
            f"base model: use --model {bare} (with --init-adapter {args.model} to start from the shipped adapter)"
        )
    check_device(args.device)  # before the data and the model load
    init_adapter = init_adapter_dir(args)
    shape = {} if init_adapter is None else finetune.adapter_shape(init_adapter)  # unless set on the command line
    options = {**shape, **train_options(args)}
    config = TrainConfig(max_value_tokens=args.max_value_tokens, **options, **docs_options(args))
    if init_adapter is not None:
        finetune.check_init_adapter(init_adapter, config)  # before the data and the model load
    model_config = ModelConfig(name=args.model, dtype=args.dtype, device=args.device, attention=args.attention)
    weights_dtype = resolve_dtype(args.dtype, args.device)  # what "auto" is here: said, and recorded
    logging.info("weights dtype: %s%s", weights_dtype,
                 f" (--dtype {args.dtype} on {args.device})" if weights_dtype != args.dtype else "")
    for flag, dtype in (("--dtype", args.dtype), ("--autocast", config.autocast)):
        if dtype is not None and (warning := emulated_dtype_warning(dtype, args.device)) is not None:
            logging.warning("%s %s", flag, warning)

    sources = gold.resolve_sources(args.train, args.attributes, args.gold)
    data = gold.load_teacher(sources, args.teacher, args.min_confidence) if args.teacher else gold.load_gold(sources)
    if not args.teacher and (draft := gold.uncorrected_draft(sources)) is not None:
        logging.warning("%s is %s as `hpd pick` wrote it: the labels are the model's own uncorrected values, "
                        "which teach it nothing new; correct the draft's values first", sources.gold, draft)
    train_products, val_products = split(data.products, args.val_fraction, config.seed)
    check_out(args.out, args.resume)
    if args.resume and not (args.out / "checkpoint" / "checkpoint.pt").is_file():  # before the model loads
        raise ValueError(f"--resume: no checkpoint in {args.out / 'checkpoint'}: the run stopped before its first one; "
                         "run the same command without --resume to start it over")
    logging.info("data: %s", json.dumps(data.stats))
    warn_about_data(data.stats, sources)
    attributes = data.attributes
    if args.examples is not None:
        attributes = examples.describe(train_products, data.attributes, args.examples)
        args.out.mkdir(parents=True, exist_ok=True)
        schema = args.out / ATTRIBUTES_FILE  # the described schema the run trains with
        schema.write_text(json.dumps(examples.schema_json(attributes), ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        logging.info("attributes described by %d example values each: %s (extract with it)", args.examples, schema)

    started = time.time()
    model, tokenizer = load_model(model_config)
    model = finetune.prepare_model(model, config, init_adapter)
    checkpoints = args.out / "checkpoint"
    if args.resume and not (checkpoints / "checkpoint.pt").is_file():
        raise ValueError(f"--resume: no checkpoint in {checkpoints}")
    identity = run_identity(args, data.stats, gold.digest(data))
    if args.resume:
        check_resume(checkpoints, identity)
    else:
        checkpoints.mkdir(parents=True, exist_ok=True)
        (checkpoints / RUN_FILE).write_text(json.dumps(identity, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if not args.teacher and (validation := write_validation(sources, val_products, args.out, attributes)):
        logging.info("validation products (%d) written to %s for hpd extract / evaluate", len(val_products), validation)

    def save_epoch(epoch: int, so_far: finetune.TrainReport) -> None:
        folder = args.out / f"epoch-{epoch}"
        finetune.save(model, tokenizer, folder, config.full)
        (folder / EPOCH_FILE).write_text(json.dumps({"epoch": epoch, "steps": so_far.steps, "val_loss": so_far.val_losses[-1]}) + "\n")
        logging.info("epoch %d saved to %s", epoch, folder)

    report = finetune.train(model, tokenizer, train_products, val_products, attributes, config,
                            checkpoint_dir=checkpoints, resume=args.resume, stop_after_epoch=args.stop_after_epoch,
                            on_epoch_end=save_epoch if args.save_epochs else None)
    if report.stopped:
        logging.info("stopped after epoch %d of %d as asked; continue with the same command and --resume "
                     "(without --stop-after-epoch, or a later one)", round(report.epochs), config.epochs)
        print(json.dumps({"out": str(args.out), "stopped": True, "steps": report.steps, "epochs": report.epochs,
                          "val_losses": report.val_losses}))
        return 0
    finetune.save(model, tokenizer, args.out, config.full)
    shutil.rmtree(checkpoints, ignore_errors=True)  # the run is complete: its result is saved

    record = {
        "args": plain_args(args),
        "train_config": asdict(config),
        "learning_rate": config.learning_rate,
        "model": asdict(model_config),  # its dtype as asked (--dtype auto: "auto")
        "dtype": weights_dtype,  # the weights' dtype it ran in (--dtype auto resolved)
        "init_adapter": init_adapter,  # --init-adapter resolved: the directory the LoRA started from
        "targets": "teacher" if args.teacher else "gold",
        "prompt_format": prompts.PROMPT_FORMAT,  # how its prompts were laid out (3: wide ones as attribute groups)
        "sources": {k: str(v) for k, v in asdict(sources).items()},
        "data": {**data.stats, "train_products": len(train_products), "val_products": len(val_products)},
        "report": {**asdict(report), "seconds_per_step": report.seconds_per_step},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "wall_seconds": time.time() - started,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu",
            "threads": torch.get_num_threads(),
        },
    }
    (args.out / CONFIG_FILE).write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    summary = {
        "out": str(args.out),
        "decoder": config.decoder,
        "steps": report.steps,
        "seconds_per_step": report.seconds_per_step,
        "train_loss": next((loss for loss in reversed(report.train_losses) if loss is not None), None),
        "val_losses": report.val_losses,
        **({"empty_steps": report.empty_steps} if report.empty_steps else {}),  # steps of unscored values only
    }
    print(json.dumps(summary))
    return 0
