"""Fine-tuning collators and training loop.

The central check: the per-token loss of the HPD training collator (one forward over the logically
ordered sequence with the training-view mask) equals the loss computed from the logits the real
cached engine produces while teacher-forcing the same gold tokens: same attention, same positions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import re
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from hpd_core.autoregressive import AutoregressiveDecoder
from hpd_core.collate import (IGNORE, Example, Labeled, ar_features, collate, hpd_features, shuffle_schema, stack_examples,
                               until_complete, value_tokens)
from hpd_core.config import DecodeConfig, ModelConfig, TrainConfig
from hpd_core.engine import HPDDecoder
from hpd_core.finetune import (adapter_shape, check_init_adapter, collate_for, mean_loss, prepare_model, remaining, save,
                               token_losses, train)
from hpd_core.layout import build_layout, encode
from hpd_core.models import ADAPTERS, load_model
from hpd_core.prompts import answer_prefix, parse_value, render_answer, render_value, value_suffix
from hpd_core.stopping import DONE, START, advance
from hpd_core.types import Product, Value

from .conftest import ARCHITECTURES, WORDS, random_request, random_text, tiny_model

K_MAX = 6
VALUES = [None, "acme 500", 'x"y', "red", "café ü", "back\\slash", "Nike"]


def random_values(rng: random.Random, request) -> tuple[tuple[str | None, ...], ...]:
    def one():
        if rng.random() < 0.15:  # longer than K_MAX tokens: cut, as the engine would cut it
            return random_text(rng, 8)
        return rng.choice(VALUES)

    return tuple(tuple(one() for _ in request.attributes) for _ in request.products)


def random_examples(seed: int, n: int) -> list[Example]:
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        request = random_request(rng, rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 8))
        examples.append(Example(request, random_values(rng, request)))
    return examples


def collator_losses(model, tokenizer, feats) -> torch.Tensor:
    """Plain model forward with the collator's ids, positions and 4D mask; CE at label positions."""
    from hpd_core import masks

    batch = collate(feats, tokenizer.pad_token_id, windows=masks.layer_windows(model.config))
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=batch["attention_mask"]
        ).logits
    keep = batch["labels"] != IGNORE
    return F.cross_entropy(logits[keep].float(), batch["labels"][keep], reduction="none")


def engine_losses(model, tokenizer, examples) -> torch.Tensor:
    """Teacher-force gold tokens through the cached engine; CE of its step logits."""
    decoder = HPDDecoder(model, tokenizer, DecodeConfig(max_value_tokens=K_MAX))
    requests = [ex.request for ex in examples]
    layouts = [build_layout(r, tokenizer, K_MAX) for r in requests]
    gold = [[tokens[:K_MAX] for tokens in value_tokens(tokenizer, ex)] for ex in examples]
    results = decoder.decode_batch(requests, layouts, forced=gold)
    losses = []
    for slots, result in zip(gold, results):
        for s, tokens in enumerate(slots):
            logits = result.extra["step_logits"][s, : len(tokens)]  # (k, V): index k predicts token k+1
            losses.append(F.cross_entropy(logits, torch.tensor(tokens), reduction="none"))
    return torch.cat(losses)


@pytest.mark.parametrize("value", [None, "Acme", 'say "hi"', "a, b"])
@pytest.mark.parametrize("terminator", [",", "\n"])
def test_gold_values_end_where_the_engine_stops(tokenizer, value, terminator):
    """The training view's gold tokens end with the token that completes the value, where the
    engine stops (stopping.py): a terminator in a token of its own after it is left out."""
    tokens = encode(tokenizer, render_value(value, terminator))
    cut = until_complete(tokenizer, tokens)
    assert cut == tokens[: len(cut)]
    assert advance(START, tokenizer.decode(cut)) == DONE
    assert all(advance(START, tokenizer.decode(cut[:n])) != DONE for n in range(len(cut)))
    assert parse_value(tokenizer.decode(cut), finished=True) == Value(value)
    if value is None:  # nothing after null's last letter
        assert tokenizer.decode(cut).strip() == "null"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_collator_loss_equals_engine_step_logits_loss(models, tokenizer, arch):
    model = models[arch]
    examples = random_examples(seed=ARCHITECTURES.index(arch), n=4)
    feats = [hpd_features(tokenizer, ex, K_MAX) for ex in examples]
    assert len({len(f.input_ids) for f in feats}) > 1  # the batch really is padded
    assert sum(f.truncated_slots for f in feats) > 0  # and includes values cut at K_max
    expected = engine_losses(model, tokenizer, examples)
    got = collator_losses(model, tokenizer, feats)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # the training path (body + LM head on label positions only) gives the same losses
    with torch.no_grad():
        trained = token_losses(model, collate_for(model, tokenizer, feats))
    torch.testing.assert_close(trained, expected, atol=1e-5, rtol=0)
    # one example alone equals the same example inside the padded batch
    alone = collator_losses(model, tokenizer, feats[1:2])
    offset = feats[0].num_labels
    torch.testing.assert_close(alone, got[offset : offset + feats[1].num_labels], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(lambda f: dataclasses.replace(f, gen=(0,) * len(f.gen)), id="no-generation-index"),
        pytest.param(lambda f: dataclasses.replace(f, position_ids=tuple(range(len(f.input_ids)))), id="no-position-gaps"),
        pytest.param(  # RoPE is relative, so only a shift of value tokens against the prompt shows
            lambda f: dataclasses.replace(f, position_ids=tuple(p + (g > 0) for p, g in zip(f.position_ids, f.gen))),
            id="value-positions-off-by-one",
        ),
    ],
)
def test_equivalence_check_detects_a_wrong_view(models, tokenizer, break_it):
    """The comparison above must fail for a collator that drops the gen-index rule or the gaps."""
    model = models["llama"]
    examples = random_examples(seed=3, n=3)
    expected = engine_losses(model, tokenizer, examples)
    broken = [break_it(hpd_features(tokenizer, ex, K_MAX)) for ex in examples]
    got = collator_losses(model, tokenizer, broken)
    assert (got - expected).abs().max() > 1e-3


def test_hpd_labels_are_the_gold_values(tokenizer):
    for example in random_examples(seed=7, n=5):
        f = hpd_features(tokenizer, example, K_MAX)
        request = example.request
        n_attr = len(request.attributes)
        for i, label in enumerate(f.labels):  # a fed value token is the label of the token before it
            if label != IGNORE and i + 1 < len(f.gen) and f.gen[i + 1] == f.gen[i] + 1:
                assert f.input_ids[i + 1] == label
        labelled = [t for t in f.labels if t != IGNORE]
        expected = []
        for s in range(request.num_slots):
            text = render_value(example.values[s // n_attr][s % n_attr], value_suffix(request, s))
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
            # up to the token that completes the value (a terminator of its own after it is not generated)
            n = next(n for n in range(1, len(tokens) + 1) if advance(START, tokenizer.decode(tokens[:n])) == DONE)
            expected += tokens[:n][:K_MAX]
        assert labelled == expected
        assert max(f.gen) <= K_MAX - 1  # the K_max-th token is a label only, never an input


def test_an_unscored_value_is_fed_but_carries_no_loss(tokenizer):
    """A value left out of the loss (a teacher's unsure one) is in the sequence as before, so the
    other slots see the same tokens, and only its own labels are gone."""
    rng = random.Random(9)
    for example in random_examples(seed=9, n=6):
        request = example.request
        n_attr = len(request.attributes)
        scored = tuple(tuple(rng.random() < 0.5 for _ in range(n_attr)) for _ in request.products)
        whole, part = hpd_features(tokenizer, example, K_MAX), hpd_features(tokenizer, dataclasses.replace(example, scored=scored), K_MAX)
        assert (part.input_ids, part.position_ids, part.gen) == (whole.input_ids, whole.position_ids, whole.gen)
        layout = build_layout(request, tokenizer, K_MAX)
        for s in range(request.num_slots):  # each slot's labels: from its anchor on, K_max at most
            anchor = whole.position_ids.index(layout.anchor_pos[s])
            width = next((i for i in range(1, K_MAX + 1) if anchor + i >= len(whole.gen) or whole.gen[anchor + i] != i), K_MAX)
            kept = part.labels[anchor : anchor + width]
            assert kept == (whole.labels[anchor : anchor + width] if scored[s // n_attr][s % n_attr] else (IGNORE,) * width)
        assert sum(1 for t in part.labels if t != IGNORE) < sum(1 for t in whole.labels if t != IGNORE) or all(map(all, scored))
        with pytest.raises(ValueError, match="for the HPD view only"):
            ar_features(tokenizer, dataclasses.replace(example, scored=((False,) * n_attr,) * len(request.products)))


def test_stacking_carries_which_values_are_scored():
    rng = random.Random(0)
    request = random_request(rng, 1, 2)
    attrs = {"A": request.attributes}
    products = [Labeled("A", Product(f"p{i}", "t"), ("x", None), (True, bool(i % 2)) if i < 3 else None) for i in range(6)]
    for example in stack_examples(products, attrs, 2, random.Random(1), 4):
        ids = [int(p.product_id[1:]) for p in example.request.products]
        expected = tuple((True, bool(i % 2)) if i < 3 else (True, True) for i in ids)
        assert example.scored == (expected if min(ids) < 3 else None)


def test_ar_labels_decode_to_the_answer(tokenizer):
    for example in random_examples(seed=8, n=4):
        f = ar_features(tokenizer, example)
        labelled = [t for t in f.labels if t != IGNORE]
        answer = render_answer(example.request, [list(v) for v in example.values])
        assert labelled[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(labelled[:-1]) == answer[len(answer_prefix()) :]
        for i, label in enumerate(f.labels):  # next-token labels: shifted copies of the inputs
            if label != IGNORE and i + 1 < len(f.input_ids):
                assert f.input_ids[i + 1] == label
        prompt = f.input_ids[: len(f.input_ids) - len(labelled)]
        assert list(prompt) == AutoregressiveDecoder.prompt_ids(_ar_stub(tokenizer), example.request)
        assert f.position_ids == tuple(range(len(f.input_ids)))


def _ar_stub(tokenizer):
    stub = AutoregressiveDecoder.__new__(AutoregressiveDecoder)
    stub.tokenizer = tokenizer
    return stub


def test_stacking_groups_one_category_per_prompt():
    rng = random.Random(0)
    request = random_request(rng, 1, 2)
    attrs = {"A": request.attributes, "B": request.attributes[:1]}
    products = [Labeled("A" if i % 3 else "B", Product(f"p{i}", "t"), (None, "x") if i % 3 else ("y",)) for i in range(10)]
    examples = stack_examples(products, attrs, 3, random.Random(1))
    assert sorted(len(ex.request.products) for ex in examples) == [1, 3, 3, 3]
    seen = [p.product_id for ex in examples for p in ex.request.products]
    assert sorted(seen) == sorted(p.product.product_id for p in products)
    for ex in examples:
        assert all(v == (("y",) if ex.request.category == "B" else (None, "x")) for v in ex.values)


def labeled_products(n: int, seed: int = 0) -> tuple[list[Labeled], dict]:
    rng = random.Random(seed)
    request = random_request(rng, 1, 2)
    products = [
        Labeled(request.category, Product(f"p{i}", random_text(rng, 4)), (rng.choice(WORDS), rng.choice([None, "red"])))
        for i in range(n)
    ]
    return products, {request.category: request.attributes}


@pytest.mark.parametrize("decoder", ["hpd", "ar"])
def test_five_steps_lower_the_training_loss(tokenizer, decoder):
    products, attrs = labeled_products(1)
    repeated = products * 2
    model = prepare_model(tiny_model("llama", len(tokenizer)), TrainConfig(lora_rank=4))
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, decoder=decoder, max_value_tokens=K_MAX,
                         lora_rank=4, lr=2e-2,
                         grad_accum=1, epochs=10, max_steps=5, warmup_ratio=0.0)
    example = stack_examples(repeated, attrs, 2, random.Random(0))
    from hpd_core.finetune import to_features

    feats = to_features(tokenizer, example, config)
    before = mean_loss(model, tokenizer, feats, 1)
    report = train(model, tokenizer, repeated, [], attrs, config)
    after = mean_loss(model, tokenizer, feats, 1)
    assert report.steps == 5
    assert after < before - 0.1
    assert report.train_losses[-1] < report.train_losses[0]
    assert report.val_losses == [None] * (1 + 5)  # one prompt per epoch: 5 epochs, no validation set


def test_a_step_of_unscored_values_only_leaves_the_weights_as_they_are(tokenizer):
    """A step whose prompts hold no target (a teacher's values all below the floor) takes no
    optimizer step: AdamW would otherwise move the weights on its momentum and weight decay with no
    gradient. The schedule still counts the step, and the report says how many there were."""
    products, attrs = labeled_products(4)
    unsure = [dataclasses.replace(p, scored=(False,) * len(p.values)) for p in products]
    config = TrainConfig(docs_per_prompt=1, max_docs_per_prompt=None, max_value_tokens=K_MAX, lora_rank=4, lr=2e-2,
                         weight_decay=0.1, grad_accum=1, epochs=2, warmup_ratio=0.0)
    model = prepare_model(tiny_model("llama", len(tokenizer)), config)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}
    report = train(model, tokenizer, unsure, [], attrs, config)
    assert report.steps == 8 and report.empty_steps == 8 and report.label_tokens == 0
    assert report.train_losses == [None] * 8
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, before[name]), name
    mixed = unsure[:2] + products[2:]  # two prompts of targets an epoch, two without
    report = train(prepare_model(tiny_model("llama", len(tokenizer)), config), tokenizer, mixed, [], attrs, config)
    assert report.steps == 8 and report.empty_steps == 4 and report.label_tokens > 0
    assert sum(loss is None for loss in report.train_losses) == 4


def test_progress_line_says_the_time_to_go(tokenizer, caplog):
    products, attrs = labeled_products(1)
    model = prepare_model(tiny_model("llama", len(tokenizer)), TrainConfig(lora_rank=4))
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, lora_rank=4, grad_accum=1,
                         epochs=3, log_every=1)
    with caplog.at_level(logging.INFO, logger="hpd_core.finetune"):
        train(model, tokenizer, products * 2, [], attrs, config)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert lines[-1].endswith(", 0m to go")
    assert remaining(390, 37.0) == "4h00m" and remaining(30, 10.0) == "5m" and remaining(61, 60.0) == "1h01m"


def test_saved_adapter_loads_and_changes_outputs(tokenizer, tmp_path):
    base_dir = tmp_path / "base"
    tiny_model("qwen3", len(tokenizer)).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    base, _ = load_model(ModelConfig(name=str(base_dir)))
    products, attrs = labeled_products(4)
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, lora_rank=4, lr=2e-2,
                         grad_accum=1, max_steps=3)
    model = prepare_model(load_model(ModelConfig(name=str(base_dir)))[0], config)
    train(model, tokenizer, products, products[:1], attrs, config)
    save(model, tokenizer, tmp_path / "adapter", full=False)
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "adapter").iterdir() if p.is_file()}
    assert modes["adapter_model.safetensors"] == 0o666 & ~umask and set(modes.values()) == {0o666 & ~umask}
    tuned, _ = load_model(ModelConfig(name=str(base_dir), adapter=str(tmp_path / "adapter")))
    ids = torch.tensor([hpd_features(tokenizer, stack_examples(products, attrs, 2, random.Random(0))[0], K_MAX).input_ids])
    with torch.no_grad():
        trained, loaded, original = (m(input_ids=ids).logits for m in (model, tuned, base))
    assert (loaded - original).abs().max() > 1e-3
    torch.testing.assert_close(loaded, trained, atol=1e-4, rtol=1e-4)


def test_training_from_an_adapter_starts_where_it_ends(tokenizer, tmp_path):
    """``init_adapter``: before any step the model is the adapter's (its saved, loaded outputs), its
    LoRA weights train in float32 even when saved in float16, and training goes on from there."""
    base_dir = tmp_path / "base"
    tiny_model("qwen3", len(tokenizer)).save_pretrained(base_dir)
    tokenizer.save_pretrained(base_dir)
    products, attrs = labeled_products(4)
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, lora_rank=4, lora_alpha=8,
                         lr=2e-2, grad_accum=1, max_steps=3)
    first = prepare_model(load_model(ModelConfig(name=str(base_dir)))[0], config)
    train(first, tokenizer, products, [], attrs, config)
    first.half()  # saved as float16, as the shipped adapters are
    save(first, tokenizer, tmp_path / "first", full=False)
    loaded, _ = load_model(ModelConfig(name=str(base_dir), adapter=str(tmp_path / "first")))

    second = prepare_model(load_model(ModelConfig(name=str(base_dir)))[0], config, str(tmp_path / "first"))
    lora = {n: p for n, p in second.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n and p.dtype == torch.float32 for n, p in lora.items())
    ids = torch.tensor([hpd_features(tokenizer, stack_examples(products, attrs, 2, random.Random(0))[0], K_MAX).input_ids])
    second.eval()
    with torch.no_grad():
        started, adapter = (m(input_ids=ids).logits for m in (second, loaded))
    torch.testing.assert_close(started, adapter, atol=1e-4, rtol=1e-4)
    before = {n: p.detach().clone() for n, p in lora.items()}
    report = train(second, tokenizer, products, [], attrs, dataclasses.replace(config, max_steps=2))
    assert report.steps == 2 and any(not torch.equal(p, before[n]) for n, p in lora.items())


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (TrainConfig(lora_rank=8, lora_alpha=8), "has LoRA rank 4 and alpha 8, the run 8 and 8"),
        (TrainConfig(lora_rank=4, lora_alpha=16), "has LoRA rank 4 and alpha 8, the run 4 and 16"),
        (TrainConfig(full=True), "for LoRA runs"),
    ],
)
def test_an_adapter_to_start_from_must_fit_the_run(tokenizer, tmp_path, config, message):
    model = prepare_model(tiny_model("llama", len(tokenizer)), TrainConfig(lora_rank=4, lora_alpha=8))
    save(model, tokenizer, tmp_path / "adapter", full=False)
    with pytest.raises(ValueError, match=message):
        prepare_model(tiny_model("llama", len(tokenizer)), config, str(tmp_path / "adapter"))


def test_an_adapter_to_start_from_that_does_not_exist_is_named_as_such(tmp_path):
    """A mistyped path says it does not exist; a folder that exists but holds no adapter says that."""
    with pytest.raises(ValueError, match=re.escape(f"adapter to start from {tmp_path / 'missing'} does not exist")):
        adapter_shape(tmp_path / "missing")
    with pytest.raises(ValueError, match=re.escape(f"adapter to start from {tmp_path} is not a PEFT adapter directory")):
        adapter_shape(tmp_path)


def test_an_adapter_to_start_from_must_be_plain_lora_of_this_model(tokenizer, tmp_path):
    fits = TrainConfig(lora_rank=4, lora_alpha=8)
    save(prepare_model(tiny_model("llama", len(tokenizer)), fits), tokenizer, tmp_path / "llama", full=False)
    with pytest.raises(ValueError, match="no adapter_config.json"):
        prepare_model(tiny_model("llama", len(tokenizer)), fits, str(tmp_path))
    dora = tmp_path / "dora"
    shutil.copytree(tmp_path / "llama", dora)
    saved = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**saved, "use_dora": True}))
    with pytest.raises(ValueError, match="not a plain LoRA adapter"):
        prepare_model(tiny_model("llama", len(tokenizer)), fits, str(dora))
    # another base: layers of other sizes; other projections (phi3's fused ones)
    for other, message in ((tiny_model("llama", len(tokenizer), intermediate_size=48), "size mismatch"),
                           (tiny_model("phi3", len(tokenizer)), "20 of its tensors fit no layer")):
        with pytest.raises(ValueError, match=f"does not fit the model .*{message}"):
            prepare_model(other, fits, str(tmp_path / "llama"))
    partial = tmp_path / "partial"  # a layer it targets without weights for it (peft would start it from zero)
    shutil.copytree(tmp_path / "llama", partial)
    tensors = load_file(partial / "adapter_model.safetensors")
    save_file({k: v for k, v in tensors.items() if ".layers.1.self_attn.q_proj." not in k}, partial / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="does not fit the model .*2 LoRA weights of the model are not in it"):
        prepare_model(tiny_model("llama", len(tokenizer)), fits, str(partial))
    # the shipped adapters are what users start from: both pass, with the recipe's rank and alpha
    for shipped in sorted(ADAPTERS.glob("*/adapter_config.json")):
        assert adapter_shape(shipped.parent) == {"lora_rank": 64, "lora_alpha": 128}
        check_init_adapter(shipped.parent, TrainConfig())


def test_full_finetune_saves_a_loadable_model(tokenizer, tmp_path):
    products, attrs = labeled_products(2)
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, full=True, lr=1e-3,
                         grad_accum=1, max_steps=2)
    model = prepare_model(tiny_model("llama", len(tokenizer)), config)
    embeddings = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    assert all(p.requires_grad == (id(p) not in embeddings) for p in model.parameters())  # the body only
    everything = prepare_model(tiny_model("llama", len(tokenizer)), dataclasses.replace(config, train_embeddings=True))
    assert all(p.requires_grad for p in everything.parameters())
    train(model, tokenizer, products, [], attrs, config)
    save(model, tokenizer, tmp_path / "full", full=True)
    loaded, _ = load_model(ModelConfig(name=str(tmp_path / "full")))
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


@pytest.mark.parametrize(
    "kwargs",
    [dict(decoder="reference"), dict(docs_per_prompt=0), dict(max_value_tokens=0), dict(lr=0.0), dict(max_steps=0),
     dict(max_docs_per_prompt=1), dict(skeleton="sideways"), dict(autocast="float8"), dict(checkpoint_minutes=0)],
)
def test_train_config_validation(kwargs):
    with pytest.raises(ValueError):
        TrainConfig(**{"docs_per_prompt": 2, "max_docs_per_prompt": None, **kwargs})


def test_train_config_defaults_are_the_shipped_adapters_recipe():
    """`hpd finetune` with no recipe options trains what the shipped default was trained with (its
    own record, training_config.json): the recipe fields, the learning rate it resolved included.
    Only how often it logged and checkpointed may differ."""
    import json

    from hpd_core.models import DEFAULT_ADAPTER_DIR

    record = json.loads((DEFAULT_ADAPTER_DIR / "training_config.json").read_text())
    operational = {"log_every", "checkpoint_minutes", "lr"}
    defaults = dataclasses.asdict(TrainConfig())
    recorded = {k: v for k, v in record["train_config"].items() if k not in operational}
    assert {k: defaults[k] for k in recorded} == recorded
    assert TrainConfig().learning_rate == record["learning_rate"] == record["train_config"]["lr"]


def _resume_run(tokenizer, tmp_path, config, stop_after, device="cpu", init_adapter=None):
    """Train a fresh tiny model; with ``stop_after``, stop there and resume in a new process-like
    setting (a new model object, optimizer and data order rebuilt from the checkpoint)."""
    products, attributes = labeled_products(24)
    val = products[:4]

    def fresh():
        return prepare_model(tiny_model("llama", len(tokenizer), seed=1).to(device), config, init_adapter)

    model = fresh()
    report = train(model, tokenizer, products, val, attributes, config, tmp_path, stop_after_steps=stop_after)
    if stop_after is not None:
        assert report.steps == stop_after
        model = fresh()  # the interrupted process is gone: only the checkpoint survives
        report = train(model, tokenizer, products, val, attributes, config, tmp_path, resume=True)
    return model, report


@pytest.mark.parametrize("where", ["epoch 0", "epoch end", "epoch 1"])
def test_resume_equals_uninterrupted_run(tokenizer, tmp_path, where):
    config = TrainConfig(docs_per_prompt=1, max_docs_per_prompt=3, max_value_tokens=K_MAX, epochs=2, grad_accum=2,
                         lora_rank=4, lr=1e-3, log_every=100)
    whole, whole_report = _resume_run(tokenizer, tmp_path / "a", config, None)
    per_epoch = whole_report.steps_per_epoch[0]
    assert per_epoch >= 3
    stop_after = {"epoch 0": 2, "epoch end": per_epoch, "epoch 1": per_epoch + 1}[where]
    resumed, resumed_report = _resume_run(tokenizer, tmp_path / "b", config, stop_after)
    assert resumed_report.steps == whole_report.steps
    assert resumed_report.train_losses == whole_report.train_losses
    assert resumed_report.val_losses == whole_report.val_losses
    a, b = dict(whole.named_parameters()), dict(resumed.named_parameters())
    trained = [n for n, p in a.items() if p.requires_grad]
    assert trained and all(torch.equal(a[n], b[n]) for n in trained)


def test_resume_from_an_adapter_equals_uninterrupted_run(tokenizer, tmp_path):
    """A run started from an adapter, interrupted: the checkpoint, not the adapter, is what resumes."""
    config = TrainConfig(docs_per_prompt=1, max_docs_per_prompt=3, max_value_tokens=K_MAX, epochs=1, grad_accum=2,
                         lora_rank=4, lr=1e-3, log_every=100)
    start = prepare_model(tiny_model("llama", len(tokenizer), seed=1), config)
    products, attributes = labeled_products(4, seed=1)
    train(start, tokenizer, products, [], attributes, dataclasses.replace(config, lr=2e-2, max_steps=2))
    save(start, tokenizer, tmp_path / "start", full=False)
    whole, whole_report = _resume_run(tokenizer, tmp_path / "a", config, None, init_adapter=str(tmp_path / "start"))
    resumed, resumed_report = _resume_run(tokenizer, tmp_path / "b", config, 2, init_adapter=str(tmp_path / "start"))
    fresh, fresh_report = _resume_run(tokenizer, tmp_path / "c", config, None)
    assert resumed_report.train_losses == whole_report.train_losses
    assert resumed_report.val_losses == whole_report.val_losses
    assert whole_report.val_losses[0] != fresh_report.val_losses[0]  # it did start from the adapter
    a, b = dict(whole.named_parameters()), dict(resumed.named_parameters())
    trained = [n for n, p in a.items() if p.requires_grad]
    assert trained and all(torch.equal(a[n], b[n]) for n in trained)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resume_on_cuda_equals_uninterrupted_run(tokenizer, tmp_path):
    """LoRA dropout on a GPU draws from the CUDA generator, which the checkpoint keeps too."""
    config = TrainConfig(docs_per_prompt=1, max_docs_per_prompt=3, max_value_tokens=K_MAX, epochs=2, grad_accum=2,
                         lora_rank=4, lr=1e-3, log_every=100, lora_dropout=0.3)
    whole, whole_report = _resume_run(tokenizer, tmp_path / "a", config, None, device="cuda")
    resumed, resumed_report = _resume_run(tokenizer, tmp_path / "b", config, 2, device="cuda")
    # within cuBLAS's run-to-run noise; other dropout masks after the resume move the losses far more
    assert resumed_report.train_losses == pytest.approx(whole_report.train_losses, rel=1e-4)
    a, b = dict(whole.named_parameters()), dict(resumed.named_parameters())
    assert all(torch.allclose(a[n], b[n], atol=1e-5) for n, p in a.items() if p.requires_grad)


def test_stop_after_epoch_then_resume_equals_uninterrupted_run(tokenizer, tmp_path):
    """A run in sittings: stopped after epoch 1 of 3 (checkpointed, the epoch's hook called), then
    resumed, it ends exactly where the uninterrupted run ends."""
    config = TrainConfig(docs_per_prompt=1, max_docs_per_prompt=3, max_value_tokens=K_MAX, epochs=3, grad_accum=2,
                         lora_rank=4, lr=1e-3, log_every=100)
    products, attributes = labeled_products(24)
    val = products[:4]

    def fresh():
        return prepare_model(tiny_model("llama", len(tokenizer), seed=1), config)

    whole_model = fresh()
    whole = train(whole_model, tokenizer, products, val, attributes, config, tmp_path / "a")
    assert not whole.stopped
    ended = []
    model = fresh()
    first = train(model, tokenizer, products, val, attributes, config, tmp_path / "b", stop_after_epoch=1,
                  on_epoch_end=lambda n, report: ended.append(n))
    assert first.stopped and ended == [1]
    assert first.steps == whole.steps_per_epoch[0] and len(first.val_losses) == 2
    model = fresh()
    rest = train(model, tokenizer, products, val, attributes, config, tmp_path / "b", resume=True,
                 on_epoch_end=lambda n, report: ended.append(n))
    assert not rest.stopped and ended == [1, 2, 3]
    assert rest.train_losses == whole.train_losses and rest.val_losses == whole.val_losses
    a, b = dict(whole_model.named_parameters()), dict(model.named_parameters())
    assert all(torch.equal(a[n], b[n]) for n, p in a.items() if p.requires_grad)


def test_schedule_spans_every_epoch_of_a_j_mix(tokenizer, tmp_path):
    """With a mix of J each epoch stacks the products anew into a different number of prompts: the
    run takes every epoch's steps and the learning-rate schedule ends (at 0) on the last of them."""
    config = TrainConfig(docs_per_prompt=1, max_docs_per_prompt=3, max_value_tokens=K_MAX, epochs=3, grad_accum=1,
                         lora_rank=4, lr=1e-3, log_every=100)
    products, attributes = labeled_products(24)
    model = prepare_model(tiny_model("llama", len(tokenizer), seed=1), config)
    report = train(model, tokenizer, products, products[:4], attributes, config, tmp_path)
    assert len(set(report.examples_per_epoch)) > 1  # the epochs do differ in length
    assert report.steps == report.planned_steps == sum(report.steps_per_epoch)
    assert round(report.epochs, 6) == 3.0
    assert len(report.val_losses) == 4


def test_mixed_j_stacks_every_size_in_range():
    products, attributes = labeled_products(200)
    examples = stack_examples(products, attributes, 1, random.Random(0), max_docs_per_prompt=8)
    sizes = {len(e.request.products) for e in examples}
    assert {1, 2, 7, 8} <= sizes and max(sizes) == 8
    assert sum(len(e.request.products) for e in examples) == len(products)


def test_shuffled_schemas_keep_each_value_with_its_attribute():
    """``shuffle_schema`` asks for a non-empty subset of the attributes in a random order, and every
    product's value and target go with their attribute; over many draws every size and order occurs.
    ``_stack`` shuffles that share of an epoch's prompts and never the validation prompts, and at 0
    stacks exactly as before."""
    from hpd_core.finetune import _stack

    rng = random.Random(3)
    request = random_request(rng, 2, 4)
    names = [a.name for a in request.attributes]
    values = tuple(tuple(f"{name}-{j}" for name in names) for j in range(2))
    scored = ((True, False, True, False), (False, True, True, True))
    example = Example(request, values, scored)
    sizes, orders = set(), set()
    for _ in range(300):
        out = shuffle_schema(example, rng)
        kept = [a.name for a in out.request.attributes]
        assert 1 <= len(kept) == len(set(kept)) and set(kept) <= set(names)
        assert out.request.products == request.products and out.request.category == request.category
        for j in range(2):
            assert out.values[j] == tuple(f"{name}-{j}" for name in kept)
            assert out.scored[j] == tuple(scored[j][names.index(name)] for name in kept)
        sizes.add(len(kept))
        orders.add(tuple(kept))
    assert sizes == {1, 2, 3, 4} and len([o for o in orders if len(o) == 4]) > 1
    assert shuffle_schema(dataclasses.replace(example, scored=None), rng).scored is None

    products, attributes = labeled_products(40)
    plain = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None)
    before = stack_examples(products, attributes, 2, random.Random(0))
    assert _stack(products, attributes, plain, random.Random(0)) == before
    shuffled = dataclasses.replace(plain, shuffle_attributes=1.0)
    whole = next(iter(attributes.values()))
    assert _stack(products, attributes, shuffled, random.Random(0), training=False) == before
    drawn = _stack(products, attributes, shuffled, random.Random(0))
    assert [ex.request.products for ex in drawn] == [ex.request.products for ex in before]
    assert any(ex.request.attributes != whole for ex in drawn)
    with pytest.raises(ValueError, match="shuffle_attributes"):
        TrainConfig(shuffle_attributes=1.5)


def test_training_prompts_wider_than_the_window_train_as_the_engine_decodes_them(tokenizer):
    """On a model with sliding layers (TINY_WINDOW, 16), an HPD training prompt whose slots pass the
    window is trained as prompts over groups of its attributes, as the engine decodes it
    (attribute_groups.split_example): each part fits the window, the parts' values are the prompt's,
    and the run plans and takes exactly those prompts. The baseline, the after-products skeleton
    and a model without sliding layers are trained as before."""
    from hpd_core.finetune import widener
    from hpd_core.layout import beyond_window

    rng = random.Random(4)
    request = random_request(rng, 1, 6)
    products = [Labeled(request.category, Product(f"p{i}", random_text(rng, 4)),
                        tuple(rng.choice([None, "red", "blue"]) for _ in range(6))) for i in range(4)]
    attributes = {request.category: request.attributes}
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, epochs=1, grad_accum=1,
                         lora_rank=4, lr=1e-3, log_every=100)
    model = prepare_model(tiny_model("gemma3", len(tokenizer)), config)
    widen = widener(model, tokenizer, config)
    stacked = stack_examples(products, attributes, 2, random.Random(0))
    parts = [part for example in stacked for part in widen(example)]
    assert len(parts) > len(stacked)
    for part in parts:
        layout = build_layout(part.request, tokenizer, K_MAX, "interleaved")
        assert beyond_window(layout, 16) == 0 or len(part.request.attributes) == 1
    first = widen(stacked[0])
    assert [sum((p.values[j] for p in first), ()) for j in range(2)] == list(stacked[0].values)
    assert sum((p.request.attributes for p in first), ()) == request.attributes
    report = train(model, tokenizer, products, [], attributes, config)
    assert report.examples_per_epoch == [len(parts)] and report.steps == report.planned_steps
    assert widener(model, tokenizer, dataclasses.replace(config, decoder="ar")) is None
    assert widener(model, tokenizer, dataclasses.replace(config, skeleton="after-products")) is None
    assert widener(tiny_model("llama", len(tokenizer)), tokenizer, config) is None


def test_a_checkpoint_planned_otherwise_is_not_resumed(tokenizer, tmp_path, monkeypatch):
    """A run checkpointed by a version that laid its prompts out otherwise (here: before wide
    prompts trained as attribute groups) is refused on resume, not continued on another schedule
    (helper-45: the plan was silently replaced, [4, 4] then [24, 24] prompts)."""
    from hpd_core import finetune

    rng = random.Random(4)
    request = random_request(rng, 1, 6)
    products = [Labeled(request.category, Product(f"p{i}", random_text(rng, 4)),
                        tuple(rng.choice([None, "red"]) for _ in range(6))) for i in range(8)]
    attributes = {request.category: request.attributes}
    config = TrainConfig(docs_per_prompt=2, max_docs_per_prompt=None, max_value_tokens=K_MAX, epochs=2, grad_accum=1,
                         lora_rank=4, lr=1e-3, log_every=100)
    unsplit = monkeypatch.context()
    with unsplit as m:
        m.setattr(finetune, "widener", lambda model, tokenizer, config: None)  # the version before
        model = prepare_model(tiny_model("gemma3", len(tokenizer)), config)
        report = train(model, tokenizer, products, [], attributes, config, tmp_path, stop_after_steps=2)
    assert report.examples_per_epoch == [4, 4]
    model = prepare_model(tiny_model("gemma3", len(tokenizer)), config)
    with pytest.raises(ValueError, match=r"planned as 4, 4 training prompts per epoch, and this version plans \d+"):
        train(model, tokenizer, products, [], attributes, config, tmp_path, resume=True)
