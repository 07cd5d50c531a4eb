"""The labelling sheet: written from gold drafts, read back as gold, checked row by row."""

import csv
import io
import json

import pytest

from datafiles.labels import SHEET_FILE, gold_text, read_sheet, sheet_rows, write_sheet

RECORDS = {
    "p1": {"product_id": "p1", "category": "Shoes", "title": "Acme red shoe, size 9", "features": ["Leather upper"]},
    "p2": {"product_id": "p2", "category": "Tea", "title": "Leafy green tea", "description": "Loose leaf, 100 g"},
}
SCHEMA = {"Shoes": ["Brand", "Color", "Material"], "Tea": ["Flavor", "Net content"]}
DRAFTS = [
    {"product_id": "p1", "category": "Shoes",
     "target_scores": {"Brand": {"Acme": 1}, "Color": {"n/a": 1}, "Material": {"n/a": 1}}},
    {"product_id": "p2", "category": "Tea", "target_scores": {"Flavor": {"green": 1}, "Net content": {"n/a": 1}}},
]
TITLES = {r["product_id"]: r["title"] for r in RECORDS.values()}


def sheet_text(rows) -> str:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue()


def edited(changes: dict) -> list[list[str]]:
    """The sheet's rows with some (product, attribute) values changed."""
    rows = list(sheet_rows(DRAFTS, TITLES))
    return [rows[0]] + [row[:4] + [changes.get((row[0], row[3]), row[4])] for row in rows[1:]]


def test_a_sheet_saved_unchanged_gives_the_draft_byte_for_byte(tmp_path):
    write_sheet(tmp_path / SHEET_FILE, DRAFTS, TITLES)
    raw = (tmp_path / SHEET_FILE).read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")  # a byte-order mark: spreadsheet programs read UTF-8
    text = raw.decode("utf-8")
    rows = list(csv.reader(io.StringIO(text.removeprefix("\ufeff"))))
    assert rows[0] == ["product_id", "category", "title", "attribute", "value"]
    assert rows[1] == ["p1", "Shoes", "Acme red shoe, size 9", "Brand", "Acme"] and rows[2][4] == ""  # n/a: empty
    sheet = read_sheet(text, "labels.csv", RECORDS, SCHEMA)
    assert sheet.gold == DRAFTS and sheet.warnings == ()
    assert gold_text(sheet.gold) == "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in DRAFTS)


def test_corrected_cells_become_the_gold_and_an_empty_cell_is_none():
    text = sheet_text(edited({("p1", "Color"): "red", ("p1", "Material"): " Leather ", ("p2", "Flavor"): "",
                              ("p2", "Net content"): "100 g"}))
    sheet = read_sheet(text, "labels.csv", RECORDS, SCHEMA)
    assert sheet.gold[0]["target_scores"] == {"Brand": {"Acme": 1}, "Color": {"red": 1}, "Material": {"Leather": 1}}
    assert sheet.gold[1]["target_scores"] == {"Flavor": {"n/a": 1}, "Net content": {"100 g": 1}}  # from the description
    assert sheet.warnings == ()  # "Leather" is in a feature, "100 g" in the description


def test_rows_in_another_order_keep_the_schemas_attribute_order_and_the_sheets_product_order():
    rows = list(sheet_rows(DRAFTS, TITLES))
    sheet = read_sheet(sheet_text([rows[0], *reversed(rows[1:])]), "labels.csv", RECORDS, SCHEMA)
    assert [g["product_id"] for g in sheet.gold] == ["p2", "p1"]
    assert list(sheet.gold[1]["target_scores"]) == ["Brand", "Color", "Material"]


def test_what_cannot_be_taught_as_it_stands_is_warned_of():
    rows = edited({("p1", "Color"): "Red"})  # the title says "red"
    rows = [r for r in rows if not (r[0] == "p1" and r[3] == "Material")]  # a row deleted
    rows = [r for r in rows if r[0] != "p2"]  # a product without rows
    sheet = read_sheet(sheet_text(rows), "labels.csv", RECORDS, SCHEMA)
    assert [g["product_id"] for g in sheet.gold] == ["p1"]
    assert sheet.gold[0]["target_scores"] == {"Brand": {"Acme": 1}, "Color": {"Red": 1}}  # Material: left out
    first, second, third = sheet.warnings
    assert first.startswith("1 value(s) are in none of their product's text fields: p1 Color: 'Red' (row 3)")
    assert second == "1 product(s) of the records have no row in the sheet and are left out of the gold: p2"
    assert third.startswith("1 product(s) lack rows for some attributes") and "p1 (Material)" in third


@pytest.mark.parametrize("change, message", [
    (lambda rows: [["id", *rows[0][1:]], *rows[1:]], "no column 'product_id' (the columns are 'id', 'category'"),
    (lambda rows: rows[:1] + [["p9", *rows[1][1:]]] + rows[2:], "row 2: product_id 'p9' is not in the sample's records"),
    (lambda rows: rows[:1] + [[rows[1][0], "Tea", *rows[1][2:]]] + rows[2:],
     "row 2: product 'p1' has category 'Tea' here and 'Shoes' in the records"),
    (lambda rows: rows[:1] + [[*rows[1][:3], "brand", "Acme"]] + rows[2:],
     "row 2: attribute 'brand' is not one of category 'Shoes''s (did you mean 'Brand'?)"),
    (lambda rows: rows[:1] + [[*rows[1][:3], "Weight", "9"]] + rows[2:],
     "row 2: attribute 'Weight' is not one of category 'Shoes''s: Brand, Color, Material"),
    (lambda rows: rows + [rows[1]], "row 7: product 'p1', attribute 'Brand' is given a second time"),
    (lambda rows: rows[:1] + [rows[1] + ["extra"]] + rows[2:], "row 2: more cells than columns"),
])
def test_rows_that_do_not_fit_the_sample_are_refused_by_row(change, message):
    rows = [list(r) for r in sheet_rows(DRAFTS, TITLES)]
    with pytest.raises(ValueError, match="^labels.csv") as err:
        read_sheet(sheet_text(change(rows)), "labels.csv", RECORDS, SCHEMA)
    assert message in str(err.value)


def test_a_spreadsheets_own_way_of_saving_is_read():
    """CRLF line ends, no byte-order mark, blank rows at the end, a title with quotes and commas."""
    rows = edited({})
    rows[1][2] = 'Acme "red" shoe, size 9'
    text = sheet_text(rows + [["", "", "", "", ""]]).replace("\r\n", "\n").replace("\n", "\r\n")
    assert read_sheet(text, "labels.csv", RECORDS, SCHEMA).gold == DRAFTS
    assert read_sheet("\ufeff" + text, "labels.csv", RECORDS, SCHEMA).gold == DRAFTS
