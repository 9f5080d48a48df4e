"""The generated code in services/fjord/_proto must match proto/ (run `make proto`)."""

from fjord.tools import genproto


def test_generated_code_is_fresh() -> None:
    expected = genproto.generate()
    actual = {p.name: p.read_text() for p in genproto.OUT_DIR.iterdir() if p.is_file()}
    stale = sorted(n for n in expected.keys() | actual.keys() if expected.get(n) != actual.get(n))
    assert not stale, f"stale generated files {stale}: run `make proto`"
