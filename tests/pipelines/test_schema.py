import json
import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipelines.schema import (
    Accepted,
    Rejected,
    ValidationConfig,
    load_schema,
    parse_schema,
    partition_value,
    validate_record,
)

SCHEMA = parse_schema({"Shoes": ["Brand", "Color"], "Tea": {"Brand": "maker", "Flavor": None}})


def test_load_json_and_yaml(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"Shoes": ["Brand"]}))
    (tmp_path / "a.yaml").write_text("Shoes:\n  Brand: the maker\n  Color: main color\n")
    assert [a.name for a in load_schema(str(tmp_path / "a.json")).attributes("Shoes")] == ["Brand"]
    yaml_schema = load_schema(str(tmp_path / "a.yaml"))
    assert [(a.name, a.description) for a in yaml_schema.attributes("Shoes")] == [
        ("Brand", "the maker"),
        ("Color", "main color"),
    ]


@pytest.mark.parametrize(
    "data, message",
    [
        ({}, "empty"),
        ([], "mapping"),
        ({"Shoes": []}, "no attributes"),
        ({"Shoes": ["Brand", "Color", "Brand"]}, r"attribute names given more than once: \['Brand'\]"),
        ({"Shoes": ["Brand\ud800"]}, "attribute name 'Brand.ud800' is not valid Unicode"),
        ({"Shoes": {"Brand": "the \ud800 maker"}}, "the description of 'Brand', 'the .ud800 maker' is not valid Unicode"),
        ({"Shoes": [""]}, "non-empty"),
        ({"Shoes": "Brand"}, "list or a mapping"),
        ({"": ["Brand"]}, "non-empty"),
        ({"x" * 300: ["Brand"]}, r"too long for a partition directory \(category=xxx\.\.\. is 309 bytes, escaped, the most is 255\)"),
        ({" Tea ": ["Brand"]}, "category ' Tea ' begins or ends with white space"),
        ({"Tea": ["Brand "]}, "attribute name 'Brand ' begins or ends with white space"),
    ],
)
def test_bad_schemas_raise_clear_errors(data, message):
    with pytest.raises(ValueError, match=message):
        parse_schema(data)


def test_missing_or_invalid_schema_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_schema(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_schema(str(tmp_path / "bad.json"))
    (tmp_path / "latin1.json").write_bytes(b'\xff\xfe{"Caf\xe9": ["Brand"]}')
    with pytest.raises(ValueError, match=r"attribute schema '.*latin1.json' is not UTF-8 text"):
        load_schema(str(tmp_path / "latin1.json"))


def test_a_key_given_twice_is_refused_not_overwritten(tmp_path):
    """JSON and YAML parsers keep the last of a key given twice: a category's attributes would be lost."""
    (tmp_path / "twice.json").write_text('{"Shoes": ["Brand"], "Tea": ["Flavor"], "Shoes": ["Color"]}')
    with pytest.raises(ValueError, match=r"twice.json' is not valid JSON: a key given more than once: \['Shoes'\]"):
        load_schema(str(tmp_path / "twice.json"))
    (tmp_path / "twice.yaml").write_text("Shoes:\n  Brand: maker\n  Brand: again\n")
    with pytest.raises(ValueError, match=r"twice.yaml' is not valid YAML.*a key given more than once: \['Brand'\]"):
        load_schema(str(tmp_path / "twice.yaml"))
    (tmp_path / "fine.yaml").write_text("Shoes: [Brand, Color]\nTea:\n  Flavor: null\n")
    assert [a.name for a in load_schema(str(tmp_path / "fine.yaml")).attributes("Tea")] == ["Flavor"]


def good(**changes):
    record = {"product_id": "p1", "category": "Shoes", "title": "Red shoe", "description": "nice", "features": ["a"]}
    record.update(changes)
    return record


@pytest.mark.parametrize(
    "record, reason",
    [
        ("not a dict", "JSON object"),
        (good(product_id=None), "missing product_id"),
        (good(product_id=""), "empty product_id"),
        (good(product_id="  "), "empty product_id"),
        (good(product_id=7.0), "product_id must be a string, got float"),
        (good(product_id=True), "product_id must be a string, got bool"),
        (good(category=None), "missing category"),
        ({"product_id": "p1", "Category": "Shoes", "title": "Red shoe"},
         "missing category (the record has 'Category': field names are lower case)"),
        (good(product_id=float("nan")), "product_id must be a string, got float (an integer id column with missing"),
        (good(category="Boats"), "unknown category 'Boats' (not in the attribute schema, --attributes)"),
        (good(category="Shoe"), "unknown category 'Shoe' (not in the attribute schema, --attributes; did you mean "
                                "'Shoes'? categories are matched exactly)"),
        (good(category=" shoes"), "unknown category ' shoes' (not in the attribute schema, --attributes; the schema "
                                  "has 'Shoes': categories are matched exactly)"),
        (good(category=["Shoes"]), "category must be a string"),
        (good(title=""), "empty title"),
        (good(title=3.5), "title must be a string"),
        (good(description=5), "description must be a string"),
        (good(features="a"), "features must be a list"),
        (good(features=["a", 1]), "features must be a list"),
        (good(title="bad \ud800 text"), "not valid Unicode"),
        (good(product_id="x" * 300), "longer than"),
    ],
)
def test_rejections(record, reason):
    verdict = validate_record(record, SCHEMA, ValidationConfig())
    assert isinstance(verdict, Rejected)
    assert reason in verdict.reason


def test_an_integer_product_id_is_its_decimal_string():
    """Catalogs number their products (a Parquet int64 column): the id is read as its decimal string,
    here and where duplicates and --skip-existing match ids."""
    from pipelines.schema import record_id

    accepted = validate_record(good(product_id=1042), SCHEMA, ValidationConfig())
    assert accepted.product.product_id == "1042"
    assert record_id(good(product_id=1042)) == "1042" and record_id(good(product_id=-3)) == "-3"
    assert record_id(good(product_id=True)) is None and record_id(good(product_id=2.0)) is None


def test_accepts_and_keeps_fields():
    verdict = validate_record(good(extra={"ignored": 1}), SCHEMA, ValidationConfig())
    assert isinstance(verdict, Accepted) and not verdict.input_truncated
    assert verdict.product.features == ("a",) and verdict.category == "Shoes"


def test_oversize_truncates_or_rejects():
    record = good(title="t" * 6, description="d" * 6, features=["f" * 6, "g" * 6])
    cut = validate_record(record, SCHEMA, ValidationConfig(max_text_chars=15))
    assert isinstance(cut, Accepted) and cut.input_truncated
    product = cut.product
    assert (product.title, product.description, product.features) == ("t" * 6, "d" * 6, ("fff",))
    rejected = validate_record(record, SCHEMA, ValidationConfig(max_text_chars=15, oversize="reject"))
    assert isinstance(rejected, Rejected) and "longer than 15" in rejected.reason


def test_config_validation():
    with pytest.raises(ValueError, match="oversize"):
        ValidationConfig(oversize="drop")
    with pytest.raises(ValueError, match="max_text_chars"):
        ValidationConfig(max_text_chars=0)


@given(st.text(min_size=1))
def test_partition_values_are_path_safe_and_reversible(category):
    value = partition_value(category)
    assert "/" not in value and "\\" not in value and "\x00" not in value
    assert value not in (".", "..") and "." not in value
    assert urllib.parse.unquote(value, errors="surrogatepass") == category or not _encodable(category)


def _encodable(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_json_text_refuses_a_key_given_twice_at_any_depth():
    from pipelines import jsontext

    assert jsontext.loads(b'{"a": {"b": 1}, "c": [{"b": 2}, {"b": 3}]}') == {"a": {"b": 1}, "c": [{"b": 2}, {"b": 3}]}
    for text in ('{"a": 1, "a": 1}', '{"x": [{"b": 1, "c": 2, "b": 3}]}', b'{"t": "x", "t": "y", "u": 1, "u": 2}'):
        with pytest.raises(jsontext.KeyGivenTwice, match=r"a key given more than once: \[('[abtu]'(, )?)+\]"):
            jsontext.loads(text)
    with pytest.raises(ValueError) as caught:  # malformed JSON is not a key given twice
        jsontext.loads('{"a": ')
    assert not isinstance(caught.value, jsontext.KeyGivenTwice)


def test_schema_file_text_reads_back_to_the_same_schema(tmp_path):
    """A YAML schema copied as `attributes.json` was not JSON: commands write ``schema_file_text``,
    which reads back (as JSON) to the same categories, attributes in order and descriptions."""
    from pipelines.schema import load_schema, schema_file_text

    yaml_file = tmp_path / "attributes.yaml"
    yaml_file.write_text("Shoes:\n  Size: the US size\n  Brand:\n  Color: colour, as written\nTea: [Flavor, Form]\n'Home & Bath/Ü': [Material]\n")
    schema = load_schema(str(yaml_file))
    (tmp_path / "attributes.json").write_text(schema_file_text(schema.categories))
    again = load_schema(str(tmp_path / "attributes.json"))
    assert again == schema and again.to_json() == schema.to_json()
    assert [a.name for a in again.attributes("Shoes")] == ["Size", "Brand", "Color"]
    assert json.loads((tmp_path / "attributes.json").read_text())["Tea"] == {"Flavor": None, "Form": None}
