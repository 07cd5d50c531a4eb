"""How the model copes with a description beside the title: values written with and without one.

The benchmarks hold titles only (OA-Mine, AE-110k), so no gold scores a product's description.
This probe measures what can be measured without one: the values `hpd extract` writes for the same
products given their title alone, a short description written for them by hand (values of the
product in it), and longer ones (that description followed by other products' descriptions, cut to
N characters; and a paragraph of shop boilerplate repeated to N characters). It counts the values
written and how many equal the title-only run's: a model that loses the title's values in a long
text writes fewer, and fewer of the same.

    python scripts/long_text_probe.py --out benchmarks/quality/long-text-s52 [--label NAME] [--data work/oa-mine-test]

Runs `python -m jobs.cli extract` from the current directory (a worktree runs its own code) on
the default model; inputs and outputs go under --out/<label>/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "work" / "oa-mine-test"  # `hpd convert extractgpt ../shared/data/oa-mine/test.jsonl --out work/oa-mine-test`

# Written for this probe from each product's title: values of the product, in shop-copy prose.
DESCRIPTIONS = {
    "oa-mine-test-00000": "The Exposure is a classic high-top sneaker from Diesel. It features a soft leather upper with suede "
    "overlays, a lace-up closure, a padded collar for comfort, and a durable rubber outsole. Imported. Available in black and white.",
    "oa-mine-test-00001": "Step out in style with the Florsheim Milano Slip-On Loafer. Crafted from smooth leather with a moc toe "
    "and a cushioned footbed, this loafer pairs well with dress pants or jeans. Rubber heel for traction. Color: Burgundy.",
    "oa-mine-test-00048": "NOW Vitamin A 25,000 IU is derived from fish liver oil. Vitamin A supports healthy vision and immune "
    "function. Suggested use: take 1 softgel daily with food. Store in a cool, dry place after opening. Not manufactured with "
    "wheat, gluten, soy, milk, egg or shellfish.",
    "oa-mine-test-00098": "Maxwell House International French Vanilla Iced Latte is a smooth, creamy coffee beverage mix. Just add "
    "the single to cold water and ice. Each box contains 8 singles. Enjoy a cafe-style treat at home.",
    "oa-mine-test-00099": "Starbucks Blonde Roast Veranda Blend is a mellow and soft coffee with notes of toasted malt and milk "
    "chocolate. Made from 100% arabica beans, ground for drip coffee makers. Roasted and packed in the USA.",
    "oa-mine-test-00149": "The Philips Sonicare ProtectiveClean 5100 removes up to 7x more plaque than a manual toothbrush. The "
    "pressure sensor alerts you when you brush too hard. Includes 3 cleaning modes, a travel case and a charger. Battery lasts "
    "two weeks on a full charge.",
    "oa-mine-test-00198": "Honey Bunches of Oats Honey Roasted combines crispy flakes with crunchy oat clusters and a touch of "
    "honey. Made with whole grain. A good source of 9 vitamins and minerals. Enjoy it with milk or as a snack.",
    "oa-mine-test-00248": "Australian Gold Botanical Sunscreen Natural Spray SPF 50 is made with a mineral and botanical blend "
    "including Kakadu plum and eucalyptus. It is water resistant for 80 minutes, lightweight, and free of oxybenzone and "
    "parabens. Reef friendly formula.",
    "oa-mine-test-00298": "Bumble and Bumble Super Rich Conditioner is a daily conditioner for all hair types. It detangles, "
    "softens and adds shine without weighing hair down. Paraben-free and sulfate-free. Apply after shampooing, leave for a "
    "minute and rinse.",
    "oa-mine-test-00343": "Shout Advanced Stain Remover removes tough stains like grass, blood and grease. Safe for colors and all "
    "washable fabrics. Refill your trigger bottle and save. Each refill bottle holds 60 oz.",
    "oa-mine-test-00391": "These Con.Struct washable face masks are made from soft, breathable cotton with adjustable ear loops. "
    "Each pack includes 6 masks in assorted grey patterns. Machine washable and reusable. One size fits most adults.",
    "oa-mine-test-00441": "Lipton Southern Sweet Iced Tea bags make it easy to brew a pitcher of sweet tea. Made with real tea "
    "leaves and sweetened. Each family size tea bag makes one gallon. Enjoy over ice with lemon.",
}
BOILERPLATE = (
    "This product is designed for everyday comfort and durability. Our team tested it over many months to make sure it "
    "holds up to daily use. Please check the size chart before ordering, and contact customer service with any questions. "
    "Care instructions: wipe clean with a damp cloth and let it dry naturally away from direct heat. "
)
VARIANTS = ("title", "own", "own+others-1000", "own+others-3000", "boilerplate-2000")


def inputs(variant: str, data: Path) -> list[dict]:
    lines = (data / "records.jsonl").read_text().splitlines()
    records = {r["product_id"]: r for r in map(json.loads, lines) if r["product_id"] in DESCRIPTIONS}
    ids = list(DESCRIPTIONS)
    rows = []
    for i, product_id in enumerate(ids):
        record = dict(records[product_id])
        own = DESCRIPTIONS[product_id]
        others = " ".join(DESCRIPTIONS[ids[(i + k) % len(ids)]] for k in range(1, len(ids)))
        if variant == "own":
            record["description"] = own
        elif variant.startswith("own+others-"):
            record["description"] = f"{own} {others}"[: int(variant.rsplit("-", 1)[1])]
        elif variant.startswith("boilerplate-"):
            n = int(variant.rsplit("-", 1)[1])
            record["description"] = (BOILERPLATE * (n // len(BOILERPLATE) + 1))[:n]
        rows.append(record)
    return rows


def values(output: Path) -> dict[tuple[str, str], str | None]:
    import pyarrow.dataset as ds

    table = ds.dataset(str(output / "attributes"), partitioning="hive").to_table()
    return {(r["product_id"], r["attribute"]): r["value"] for r in table.to_pylist()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--label", default="run")
    parser.add_argument("--data", type=Path, default=DATA, help="OA-Mine test as `hpd convert` writes it")
    args = parser.parse_args()
    folder = args.out / args.label
    folder.mkdir(parents=True, exist_ok=True)
    found = {}
    for variant in VARIANTS:
        source = folder / f"{variant}.jsonl"
        source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in inputs(variant, args.data)))
        output = folder / f"out-{variant}"
        done = subprocess.run([sys.executable, "-m", "jobs.cli", "extract", "--input", str(source), "--attributes",
                               str(args.data / "attributes.json"), "--output", str(output)], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        found[variant] = values(output)
    base = found["title"]
    summary = {v: {"values": sum(x is not None for x in found[v].values()), "slots": len(found[v]),
                   "same_as_title_only": sum(found[v][k] == base[k] for k in base)} for v in VARIANTS}
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
