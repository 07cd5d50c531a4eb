"""Session planning A/B on this machine: HPD decodes the same records with
``batching.plan_sessions`` as it is (a cheap prompt joins a session where it adds no wave) and
with the rule before session 60 (a session holds prompts of at least half its first's row cost),
alternating, in one process; the values must be the same in float32 (in bfloat16 a prompt's
rounding can depend on its batch), and the timed decodes say what the
planning changes (GPU session 60: a category's short last prompt decoded in a session of its own).

    python scripts/plan_ab.py --records work/oa-mine-test/records.jsonl \
        --attributes work/oa-mine-test/attributes.json [--docs-per-prompt 6] [--runs 2] [--max-batch-size 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.workload import records_workload  # noqa: E402
from hpd_core import batching  # noqa: E402
from hpd_core.config import DecodeConfig, ModelConfig  # noqa: E402
from hpd_core.decoders import make_decoder  # noqa: E402
from hpd_core.models import load_model  # noqa: E402


def half_rule(prompt_lens, slots, max_value_tokens, token_budget, max_rows):
    """The rule before session 60."""
    costs = [batching.row_cost(n, s, max_value_tokens) for n, s in zip(prompt_lens, slots)]
    sessions: list[list[int]] = []
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        if sessions and 2 * costs[i] >= costs[sessions[-1][0]]:
            sessions[-1].append(i)
        else:
            sessions.append([i])
    return sessions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", required=True)
    ap.add_argument("--attributes", required=True)
    ap.add_argument("--docs-per-prompt", type=int, default=6)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--max-batch-size", type=int, default=DecodeConfig().max_batch_size)
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--spans", default="auto")
    ap.add_argument("--limit", type=int, default=None, help="the first N records")
    args = ap.parse_args()
    model, tokenizer = load_model(ModelConfig(name=args.model, dtype=args.dtype, device="cpu"))
    requests = list(records_workload(args.records, args.attributes, args.docs_per_prompt, args.limit).requests)
    config = DecodeConfig(max_batch_size=args.max_batch_size, spans=args.spans)
    decoder = make_decoder("hpd", model, tokenizer, config)
    layouts = decoder.prepare(requests)
    costs = [decoder.cost(layout) for layout in layouts]
    rules = {"now": batching.plan_sessions, "half": half_rule}
    for name, rule in rules.items():
        plan = rule([c[0] for c in costs], [c[1] for c in costs], config.max_value_tokens, decoder.token_budget, config.max_batch_size)
        print(f"{name}: {len(plan)} sessions of {[len(s) for s in plan]} prompts", flush=True)
    decoder.decode(requests[: 2 * args.docs_per_prompt])  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in rules}
    values: dict[str, list] = {}
    for run in range(args.runs):
        for name, rule in rules.items():
            batching.plan_sessions = rule
            before = dict(decoder.runner.counts)
            start = time.perf_counter()
            results = decoder.decode(requests, prepared=layouts)
            seconds[name].append(time.perf_counter() - start)
            got = [v for r in results for product in r.values for v in product]
            if name in values and got != values[name]:
                print(f"run {run + 1} {name}: values differ from its run before", flush=True)
            values[name] = got
            forwards = {kind: n - before[kind] for kind, n in decoder.runner.counts.items()}
            print(f"run {run + 1} {name}: {seconds[name][-1]:.2f} s, forwards {forwards}", flush=True)
    batching.plan_sessions = rules["now"]
    differ = sum(a != b for a, b in zip(values["now"], values["half"]))
    best = {name: min(s) for name, s in seconds.items()}
    print(f"{differ} of {len(values['now'])} values differ between the plans; best of {args.runs}: now {best['now']:.2f} s, half {best['half']:.2f} s: "
          f"{best['half'] / best['now']:.3f}x ({len(requests)} prompts, {sum(len(r.products) for r in requests)} products)")


if __name__ == "__main__":
    main()
